// Copy buttons: <button data-copy="#element-id"> copies that element's text.
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1500);
    });
  });
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
