// The blind vote page's keys (templates/evaluation/_vote.html), as the annotation page's
// (static/feedback/annotate.js): a / b / t / x vote A, B, tie, both bad; c focuses the comment;
// keys typed into the comment are text (Escape leaves it, Ctrl+Enter does nothing special).
// A refused vote (4xx, plain text) is shown in the form's .errors line instead of swapped in.
(function () {
  "use strict";
  document.addEventListener("keydown", (ev) => {
    if (ev.altKey || ev.metaKey || ev.ctrlKey) return;
    const t = ev.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA")) {
      if (ev.key === "Escape") t.blur();
      return;
    }
    const form = document.querySelector("#vote form.blind");
    if (!form) return;
    if (ev.key === "c") {
      const comment = form.querySelector("input[name=comment]");
      if (comment) { ev.preventDefault(); comment.focus(); }
      return;
    }
    const button = form.querySelector('button[data-key="' + ev.key + '"]');
    if (button && !form.classList.contains("sending")) {
      ev.preventDefault();
      form.classList.add("sending");
      button.click();
    }
  });
  document.body.addEventListener("htmx:afterRequest", (ev) => {
    const form = ev.detail.elt.closest && ev.detail.elt.closest("form.blind");
    if (form) form.classList.remove("sending");
  });
  document.body.addEventListener("htmx:beforeSwap", (ev) => {
    const xhr = ev.detail.xhr;
    if (xhr.status < 400 || xhr.status >= 500) return;
    ev.detail.shouldSwap = false;
    ev.detail.isError = false;
    const form = ev.detail.elt.closest("form") || ev.detail.elt;
    const box = form.querySelector(".errors");
    if (box) box.textContent = xhr.responseText;
  });
})();
