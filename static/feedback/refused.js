// A refused form (400 / 403: plain text naming the problem, apps/feedback/views._error): keep
// what the person typed and show the message in the form's own .errors line, rather than
// swapping the text in place of the form or leaving htmx to report an error. Loaded by the
// annotation page and by the fragments' pages of their own (feedback/standalone.html).
(function () {
  "use strict";
  document.body.addEventListener("htmx:beforeSwap", (ev) => {
    const xhr = ev.detail.xhr;
    if (xhr.status !== 400 && xhr.status !== 403) return;
    ev.detail.shouldSwap = false;
    ev.detail.isError = false;
    const form = ev.detail.elt.closest("form") || ev.detail.elt;
    const box = form.querySelector(".errors");
    if (box) box.textContent = xhr.responseText;
  });
})();
