// A fragment's page of its own (feedback/standalone.html) has none of the annotation page's
// cards: a save's out-of-band updates of them (hx-swap-oob: the ranked items' cards, say) have
// no target here, and htmx reported each as an error (htmx:oobErrorNoTarget, found by the
// crawl once it saved a ranking on this page). They are dropped from the answer before the swap.
(function () {
  "use strict";
  document.body.addEventListener("htmx:beforeSwap", (ev) => {
    const html = ev.detail.serverResponse;
    if (typeof html !== "string" || html.indexOf("hx-swap-oob") < 0) return;
    const answer = document.createElement("template");
    answer.innerHTML = html;
    let dropped = false;
    answer.content.querySelectorAll("[hx-swap-oob]").forEach((el) => {
      const spec = el.getAttribute("hx-swap-oob") || "true";
      const target = spec.indexOf(":") >= 0 ? spec.slice(spec.indexOf(":") + 1) : (el.id ? "#" + CSS.escape(el.id) : "");
      let found = null;
      try { found = target ? document.querySelector(target) : null; } catch (e) { found = null; }
      if (target && !found) { el.remove(); dropped = true; }
    });
    if (dropped) ev.detail.serverResponse = answer.innerHTML;
  });
})();
