// Copy buttons: <button data-copy="#element-id"> copies that element's text exactly as shown (a
// command block: its lines, joined by newlines). The Clipboard API needs a secure context (https or
// localhost); on a plain-http site the text is selected and copied with the older command instead.
(function () {
  "use strict";
  function done(button) {
    var label = button.textContent;
    button.textContent = "Copied";
    setTimeout(function () { button.textContent = label; }, 1500);
  }
  function fallback(source, text, button) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    button.focus();
    if (ok) { done(button); return; }
    // Nothing copied: leave the text selected, so Ctrl+C copies it.
    var range = document.createRange();
    range.selectNodeContents(source);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    button.textContent = "Press Ctrl+C";
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.textContent.replace(/^\s+|\s+$/g, "");
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(button); }, function () { fallback(source, text, button); });
    } else {
      fallback(source, text, button);
    }
  });
})();

// Kind-of-machine tabs of the install commands (role="tablist"): arrows, Home and End move between
// tabs, as the WAI-ARIA tabs pattern has it. Without this script every machine's commands show.
(function () {
  "use strict";
  function select(tab, focus) {
    var list = tab.closest("[role=tablist]");
    list.querySelectorAll("[role=tab]").forEach(function (other) {
      var on = other === tab;
      other.setAttribute("aria-selected", on ? "true" : "false");
      other.tabIndex = on ? 0 : -1;
      var panel = document.getElementById(other.getAttribute("aria-controls"));
      if (panel) panel.hidden = !on;
    });
    if (focus) tab.focus();
  }
  function setUp(root) {
    root.querySelectorAll("[data-install]:not(.tabs-ready)").forEach(function (install) {
      var list = install.querySelector("[role=tablist]");
      if (!list) return;
      var tabs = Array.prototype.slice.call(list.querySelectorAll("[role=tab]"));
      var chosen = tabs.filter(function (t) { return t.getAttribute("aria-selected") === "true"; })[0] || tabs[0];
      select(chosen, false);
      install.classList.add("tabs-ready");
      list.addEventListener("click", function (event) {
        var tab = event.target.closest("[role=tab]");
        if (tab) select(tab, false);
      });
      list.addEventListener("keydown", function (event) {
        var at = tabs.indexOf(document.activeElement);
        if (at < 0) return;
        var to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: tabs.length - 1 }[event.key];
        if (to === undefined) return;
        event.preventDefault();
        select(tabs[(to + tabs.length) % tabs.length], true);
      });
      // The swarm picker rewrites the slug in every command of this box (no reload: a token shown once
      // stays on the page).
      var picker = install.querySelector("[data-swarm-picker]");
      if (picker) {
        picker.addEventListener("change", function () {
          var scope = install.closest("main") || document;
          scope.querySelectorAll("[data-swarm-slug]").forEach(function (slug) { slug.textContent = picker.value; });
        });
      }
    });
  }
  setUp(document);
  document.addEventListener("htmx:afterSettle", function (event) { setUp(event.target); });
})();

// A page answering a form post (a token shown once) names the address it stands for: the address bar
// takes it, so a reload asks for that page instead of posting the form again, and the element it is
// on gets the focus (it is what the post produced).
(function () {
  "use strict";
  var element = document.querySelector("[data-replace-url]");
  if (!element || !window.history || !history.replaceState) return;
  history.replaceState(null, "", element.getAttribute("data-replace-url"));
  element.focus();
})();

// Polling (hx-trigger="every Ns") pauses while the tab is hidden. Done here rather than with a
// trigger filter, which htmx evaluates as code: the Content-Security-Policy forbids eval.
document.addEventListener("htmx:beforeRequest", function (event) {
  var trigger = event.detail.elt.getAttribute("hx-trigger") || "";
  if (document.visibilityState !== "visible" && /^every /.test(trigger)) event.preventDefault();
});
