// Small SVG charts drawn from the JSON API (no library). An element with data-chart="line|bar",
// data-source (URL), data-series (key of a list in the JSON; "a.b" for a nested one), data-x / data-y
// (keys of each point) and optional data-y-max is (re)drawn on load and every 15 s. A line chart
// with several keys in data-y ("sharing,silo") draws one line per key on one time axis, with
// data-labels naming them in a legend.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var W = 640, H = 270, PAD = { left: 44, right: 12, top: 16, bottom: 64 };
  var TICKS = 4, LABEL_GAP = 6;
  var measurer = null;

  function el(name, attrs, text) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function hourLabel(iso) {
    var d = new Date(iso);
    return String(d.getUTCHours()).padStart(2, "0") + "h";
  }

  function xLabel(value) {
    // Hours (ISO dates) read "21 Nov 14h"; names (datasets) lose their underscores.
    if (/^\d{4}-\d{2}-\d{2}T/.test(String(value))) {
      var d = new Date(value);
      return d.getUTCDate() + " " + d.toLocaleString("en", { month: "short", timeZone: "UTC" }) + " " + hourLabel(value);
    }
    var label = String(value).replace(/_/g, " ");
    return label.length > 28 ? label.slice(0, 27) + "…" : label;
  }

  function unsignedZero(text) {
    // "-0.00" -> "0.00": a figure that rounds to zero reads as zero (as the pages' num filter does).
    return /^[-\u2212][0.,%]*$/.test(text) ? text.slice(1) : text;
  }

  function yText(v, format, scale) {
    // `scale` (the axis maximum) gives every label of an axis the same decimals; thousands are
    // grouped ("12,345"), so a large figure reads at a glance and keeps every digit.
    if (format === "pct") return unsignedZero((v * 100).toFixed(0) + "%");
    var digits = Math.abs(scale === undefined ? v : scale) >= 10 ? 0 : 2;
    return unsignedZero(v.toLocaleString("en", { minimumFractionDigits: digits, maximumFractionDigits: digits }));
  }

  function textWidth(box, text) {
    // Measured in the font the chart's labels are drawn in, so no label is cut by the left margin.
    // (11px: site.css's `.chart text`; the family is inherited from the chart's box.)
    if (!measurer) measurer = document.createElement("canvas").getContext("2d");
    measurer.font = "11px " + getComputedStyle(box).fontFamily;
    return measurer.measureText(text).width;
  }

  function yAxis(box, yMax, format) {
    // The labels first, then the left margin wide enough for the widest of them.
    var labels = [];
    for (var i = 0; i <= TICKS; i++) labels.push(yText((yMax * i) / TICKS, format, yMax));
    var widest = Math.max.apply(null, labels.map(function (t) { return textWidth(box, t); }));
    PAD.left = Math.max(44, Math.ceil(widest) + LABEL_GAP + 4);
    return labels;
  }

  function barMargins(box, labels) {
    // A bar's label is drawn slanted 30 degrees up to the left of its bar's middle: the bottom margin
    // holds the longest one (sin 30 = .5 of its width) and the left margin the first one (cos 30 =
    // .87), so no dataset's name loses its first letters or its end to the picture's edge.
    var widths = labels.map(function (t) { return textWidth(box, t); });
    PAD.bottom = Math.max(64, Math.ceil(0.5 * Math.max.apply(null, widths)) + 26);
    var slot = (W - PAD.left - PAD.right) / labels.length;
    var first = Math.ceil(0.87 * widths[0]) + 6;
    if (PAD.left + slot / 2 < first) PAD.left = Math.ceil(first - slot / 2);
  }

  function frame(svg, labels) {
    for (var i = 0; i <= TICKS; i++) {
      var y = PAD.top + (H - PAD.top - PAD.bottom) * (1 - i / TICKS);
      svg.appendChild(el("line", { "class": "grid-line", x1: PAD.left, x2: W - PAD.right, y1: y, y2: y }));
      svg.appendChild(el("text", { "class": "y-label", x: PAD.left - LABEL_GAP, y: y + 4, "text-anchor": "end" }, labels[i]));
    }
    svg.appendChild(el("line", { "class": "axis", x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom }));
  }

  function draw(box, points, opts) {
    // Draw at the box's own width, so labels keep their size on a phone.
    W = Math.max(300, Math.min(900, Math.round(box.clientWidth || 640)));
    box.textContent = "";
    points = points.filter(function (p) { return p[opts.y] !== null && p[opts.y] !== undefined; });
    if (!points.length) {
      box.appendChild(Object.assign(document.createElement("p"), { className: "chart-empty", textContent: "No verified groups in this period yet." }));
      return;
    }
    // The axis starts at zero: its top is never below it (all-negative figures would give "-0.00" ticks).
    var yMax = opts.yMax || Math.max.apply(null, points.map(function (p) { return Math.max(p[opts.y], 0); })) || 1;
    var yLabels = yAxis(box, yMax, opts.format);
    PAD.bottom = 64;
    if (opts.kind === "bar") barMargins(box, points.map(function (p) { return xLabel(p[opts.x]); }));
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "xMidYMid meet", focusable: "false", "aria-hidden": "true" });
    frame(svg, yLabels);
    var plotW = W - PAD.left - PAD.right, plotH = H - PAD.top - PAD.bottom;
    function yPos(v) { return PAD.top + plotH * (1 - Math.max(0, Math.min(v, yMax)) / yMax); }
    var n = points.length, every = Math.max(1, Math.ceil(n / 8));
    if (opts.kind === "bar") {
      var slot = plotW / n, bw = Math.min(72, Math.max(4, slot * 0.6));
      points.forEach(function (p, i) {
        var x = PAD.left + slot * i + (slot - bw) / 2, y = yPos(p[opts.y]), cx = x + bw / 2;
        var bar = el("rect", { "class": "bar", x: x, y: y, width: bw, height: H - PAD.bottom - y, rx: 3 });
        bar.appendChild(el("title", {}, xLabel(p[opts.x]) + ": " + yText(p[opts.y], opts.format)));
        svg.appendChild(bar);
        if (n <= 16) svg.appendChild(el("text", { x: cx, y: y - 4, "text-anchor": "middle" }, yText(p[opts.y], opts.format)));
        if (i % every === 0 || i === n - 1) {
          var ly = H - PAD.bottom + 14;
          svg.appendChild(el("text", { x: cx, y: ly, "text-anchor": "end", transform: "rotate(-30 " + cx + " " + ly + ")" }, xLabel(p[opts.x])));
        }
      });
    } else {
      // x by time: hours without groups leave a gap instead of being squeezed out.
      var times = points.map(function (p) { return new Date(p[opts.x]).getTime(); });
      var t0 = Math.min.apply(null, times), span = Math.max.apply(null, times) - t0;
      var coords = points.map(function (p, i) {
        return [PAD.left + (span > 0 ? plotW * (times[i] - t0) / span : plotW / 2), yPos(p[opts.y])];
      });
      var path = coords.map(function (c, i) { return (i ? "L" : "M") + c[0].toFixed(1) + " " + c[1].toFixed(1); }).join(" ");
      svg.appendChild(el("path", { "class": "area", d: path + " L" + coords[n - 1][0] + " " + (H - PAD.bottom) + " L" + coords[0][0] + " " + (H - PAD.bottom) + " Z" }));
      svg.appendChild(el("path", { "class": "line", d: path }));
      coords.forEach(function (c, i) {
        var dot = el("circle", { "class": "dot", cx: c[0], cy: c[1], r: n === 1 ? 5 : 3 });
        dot.appendChild(el("title", {}, hourLabel(points[i][opts.x]) + ": " + unsignedZero(points[i][opts.y].toFixed(3))));
        svg.appendChild(dot);
        if (i % every === 0 || i === n - 1) {
          svg.appendChild(el("text", { x: c[0], y: H - PAD.bottom + 16, "text-anchor": "middle" }, hourLabel(points[i][opts.x])));
          if (n <= 3) svg.appendChild(el("text", { x: c[0], y: c[1] - 9, "text-anchor": "middle" }, yText(points[i][opts.y], "num")));
        }
      });
    }
    box.appendChild(svg);
  }

  function drawLines(box, points, opts) {
    var keys = opts.y.split(","), labels = (opts.labels || opts.y).split(",");
    W = Math.max(300, Math.min(900, Math.round(box.clientWidth || 640)));
    box.textContent = "";
    points = points.filter(function (p) { return keys.some(function (k) { return p[k] !== null && p[k] !== undefined; }); });
    if (!points.length) {
      box.appendChild(Object.assign(document.createElement("p"), { className: "chart-empty", textContent: "No verified groups in this period yet." }));
      return;
    }
    var all = [];
    points.forEach(function (p) { keys.forEach(function (k) { if (p[k] !== null && p[k] !== undefined) all.push(p[k]); }); });
    var yMax = opts.yMax || Math.max.apply(null, all.map(function (v) { return Math.max(v, 0); })) || 1;
    var yLabels = yAxis(box, yMax, opts.format);
    PAD.bottom = 64;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "xMidYMid meet", focusable: "false", "aria-hidden": "true" });
    frame(svg, yLabels);
    var plotW = W - PAD.left - PAD.right, plotH = H - PAD.top - PAD.bottom;
    var times = points.map(function (p) { return new Date(p[opts.x]).getTime(); });
    var t0 = Math.min.apply(null, times), span = Math.max.apply(null, times) - t0;
    function xPos(i) { return PAD.left + (span > 0 ? plotW * (times[i] - t0) / span : plotW / 2); }
    function yPos(v) { return PAD.top + plotH * (1 - Math.max(0, Math.min(v, yMax)) / yMax); }
    var every = Math.max(1, Math.ceil(points.length / 8));
    points.forEach(function (p, i) {
      if (i % every === 0 || i === points.length - 1) {
        svg.appendChild(el("text", { x: xPos(i), y: H - PAD.bottom + 16, "text-anchor": "middle" }, hourLabel(p[opts.x])));
      }
    });
    keys.forEach(function (k, s) {
      var coords = [];
      points.forEach(function (p, i) { if (p[k] !== null && p[k] !== undefined) coords.push([xPos(i), yPos(p[k]), p]); });
      if (!coords.length) return;
      var path = coords.map(function (c, i) { return (i ? "L" : "M") + c[0].toFixed(1) + " " + c[1].toFixed(1); }).join(" ");
      svg.appendChild(el("path", { "class": "line series-" + s, d: path }));
      coords.forEach(function (c) {
        var dot = el("circle", { "class": "dot series-" + s, cx: c[0], cy: c[1], r: coords.length === 1 ? 5 : 3 });
        dot.appendChild(el("title", {}, labels[s] + ", " + hourLabel(c[2][opts.x]) + ": " + unsignedZero(c[2][k].toFixed(3))));
        svg.appendChild(dot);
      });
    });
    box.appendChild(svg);
    var legend = Object.assign(document.createElement("p"), { className: "chart-legend small" });
    keys.forEach(function (k, s) {
      legend.appendChild(Object.assign(document.createElement("span"), { className: "key series-" + s, textContent: labels[s] }));
    });
    box.appendChild(legend);
  }

  function refresh(box) {
    fetch(box.dataset.source, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) {
        var series = (box.dataset.series || "").split(".").reduce(function (o, k) { return k && o ? o[k] : o; }, data);
        var opts = {
          kind: box.dataset.chart, x: box.dataset.x, y: box.dataset.y, format: box.dataset.format || "pct",
          yMax: box.dataset.yMax ? parseFloat(box.dataset.yMax) : null, labels: box.dataset.labels,
        };
        (opts.y.indexOf(",") >= 0 ? drawLines : draw)(box, series || [], opts);
        box.dataset.drawn = "1";
      })
      .catch(function () { box.textContent = "The chart could not be loaded."; });
  }

  function start() {
    document.querySelectorAll("[data-chart]").forEach(refresh);
    setInterval(function () {
      if (document.visibilityState === "visible") document.querySelectorAll("[data-chart]").forEach(refresh);
    }, 15000);
    // Fragments swapped in by htmx (a node card after an action) draw their charts at once.
    document.body.addEventListener("htmx:afterSettle", function (event) {
      event.target.querySelectorAll("[data-chart]:not([data-drawn])").forEach(refresh);
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
