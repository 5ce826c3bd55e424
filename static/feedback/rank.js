// Ranking a group: every completion starts unranked, and the ranking cannot be saved until
// each has its place. Click, Enter or its number ranks a completion next; drag, the arrow
// buttons or Alt+Up/Down reorder; "unrank" puts it back. The hidden number inputs carry the
// order to the server, which also refuses an incomplete ranking (the no-JavaScript path).
(function () {
  "use strict";

  function setup(form) {
    if (!form || form.dataset.rankReady) return;
    form.dataset.rankReady = "1";
    form.classList.add("rank-js");
    const ranked = form.querySelector("ol.ranked");
    const unranked = form.querySelector("ul.unranked");
    const save = form.querySelector(".rank-save");
    const status = form.querySelector(".rank-status");
    const size = Number(form.dataset.size) || unranked.children.length;
    const items = () => Array.from(form.querySelectorAll(".rank-item"));

    function sync() {
      Array.from(ranked.children).forEach((li, i) => {
        li.querySelector("input[type=number]").value = String(i + 1);
        li.querySelector(".rank-badge").textContent = String(i + 1);
      });
      Array.from(unranked.children).forEach((li, i) => {
        li.querySelector("input[type=number]").value = "";
        li.querySelector(".rank-badge").textContent = String(i + 1);
      });
      const left = unranked.children.length;
      save.disabled = left > 0;
      form.dataset.complete = left ? "0" : "1";
      status.textContent = left
        ? "Ranked " + ranked.children.length + " of " + size + ": rank " + left + " more to save."
        : "All " + size + " ranked, best first. Save when the order is right.";
    }
    function rankNext(li) {
      if (li.parentNode === unranked) ranked.appendChild(li);
      sync();
      const next = unranked.querySelector(".rank-item");
      (next || li).focus();
    }
    function unrank(li) { unranked.appendChild(li); sync(); li.focus(); }
    function shift(li, step) {
      if (li.parentNode !== ranked) return;
      const sib = step < 0 ? li.previousElementSibling : li.nextElementSibling;
      if (!sib) return;
      if (step < 0) ranked.insertBefore(li, sib); else ranked.insertBefore(sib, li);
      sync();
      li.focus();
    }

    form.addEventListener("click", (ev) => {
      const li = ev.target.closest(".rank-item");
      if (!li) return;
      if (ev.target.closest(".rank-up")) return shift(li, -1);
      if (ev.target.closest(".rank-down")) return shift(li, 1);
      if (ev.target.closest(".rank-out")) return unrank(li);
      if (ev.target.closest("a, summary, input, button")) return;
      if (li.parentNode === unranked) rankNext(li);
    });
    form.addEventListener("keydown", (ev) => {
      const li = ev.target.closest && ev.target.closest(".rank-item");
      if (ev.target.tagName === "INPUT" && ev.target.type !== "number") return;
      if (li && ev.altKey && (ev.key === "ArrowUp" || ev.key === "ArrowDown")) {
        ev.preventDefault();
        ev.stopPropagation();
        return shift(li, ev.key === "ArrowUp" ? -1 : 1);
      }
      if (li && (ev.key === "Enter" || ev.key === " ") && ev.target === li) {
        ev.preventDefault();
        ev.stopPropagation();
        return li.parentNode === unranked ? rankNext(li) : unrank(li);
      }
      if (/^[1-9]$/.test(ev.key) && !ev.ctrlKey && !ev.metaKey && !ev.altKey) {
        // The number shown on an unranked completion ranks it next.
        const target = unranked.children[Number(ev.key) - 1];
        ev.preventDefault();
        ev.stopPropagation();
        if (target) rankNext(target);
      }
    });
    // Drag to reorder, or from the unranked pool into the ranking.
    let dragged = null;
    items().forEach((li) => {
      li.addEventListener("dragstart", (ev) => { dragged = li; ev.dataTransfer.effectAllowed = "move"; li.classList.add("dragging"); });
      li.addEventListener("dragend", () => { li.classList.remove("dragging"); dragged = null; sync(); });
    });
    [ranked, unranked].forEach((list) => {
      list.addEventListener("dragover", (ev) => {
        if (!dragged) return;
        ev.preventDefault();
        const after = Array.from(list.children).find((c) => c !== dragged && ev.clientY < c.getBoundingClientRect().top + c.offsetHeight / 2);
        list.insertBefore(dragged, after || null);
      });
      list.addEventListener("drop", (ev) => { ev.preventDefault(); sync(); });
    });
    form.addEventListener("submit", (ev) => {
      if (unranked.children.length) {
        ev.preventDefault();
        ev.stopImmediatePropagation();
        status.textContent = "Rank every completion before saving: " + unranked.children.length + " left.";
      }
    }, true);
    form.addEventListener("htmx:confirm", (ev) => { if (unranked.children.length) ev.preventDefault(); });
    sync();
    const first = unranked.querySelector(".rank-item");
    if (first) first.focus();
  }

  function scan(root) { (root || document).querySelectorAll("form.rank").forEach(setup); }
  document.addEventListener("htmx:afterSwap", (ev) => scan(ev.detail.target));
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", () => scan()); else scan();
  window.rftRankSetup = scan;
})();
