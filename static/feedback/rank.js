// Ranking a group: the ranking has one numbered place per completion, best first, and every
// completion starts unranked under its own letter (A, B, C…), which never changes. Nothing
// renumbers under the person's fingers: a number key puts the focused completion at that place
// (the one there before swaps to where it came from), then focus moves to the next unranked
// one; when one completion and one place are left it goes there by itself. Enter saves once
// all are ranked, as the hint says. With a mouse or a finger: a tap ranks a completion at the
// first free place, drag drops it on a place, the arrows and "unrank" adjust. The hidden
// number inputs carry the places to the server, which also refuses an incomplete ranking (the
// no-JavaScript path, where people type the numbers).
(function () {
  "use strict";

  const LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";

  function setup(form) {
    if (!form || form.dataset.rankReady) return;
    form.dataset.rankReady = "1";
    form.classList.add("rank-js");
    const ranked = form.querySelector("ol.ranked");
    const pool = form.querySelector("ul.unranked");
    const save = form.querySelector(".rank-save");
    const status = form.querySelector(".rank-status");
    const items = Array.from(form.querySelectorAll(".rank-item"));
    const size = items.length;

    items.forEach((li, i) => {
      li.dataset.letter = LETTERS[i] || String(i + 1);
      const letter = document.createElement("span");
      letter.className = "rank-letter";
      letter.textContent = li.dataset.letter;
      li.insertBefore(letter, li.querySelector(".rank-input"));
    });
    // One place per completion, numbered once and for all.
    const slots = [];
    ranked.textContent = "";
    for (let k = 1; k <= size; k++) {
      const slot = document.createElement("li");
      slot.className = "rank-slot";
      slot.dataset.place = String(k);
      const number = document.createElement("span");
      number.className = "rank-place";
      number.textContent = String(k);
      const empty = document.createElement("span");
      empty.className = "rank-empty muted";
      empty.textContent = k <= 9 ? "empty: press " + k + " on a completion, or drop one here" : "empty: drop a completion here";
      slot.append(number, empty);
      ranked.appendChild(slot);
      slots.push(slot);
    }
    const occupant = (slot) => slot.querySelector(".rank-item");
    const placeOf = (li) => { const s = li.closest(".rank-slot"); return s ? Number(s.dataset.place) : 0; };
    const unrankedItems = () => items.filter((li) => !placeOf(li));

    function sync() {
      items.forEach((li) => {
        const place = placeOf(li);
        li.querySelector("input[type=number]").value = place ? String(place) : "";
        li.querySelector(".rank-badge").textContent = place ? String(place) : "–";
        li.setAttribute("aria-label", "completion " + li.dataset.letter + (place ? ", ranked " + place + " of " + size : ", not ranked"));
      });
      slots.forEach((s) => { s.classList.toggle("filled", !!occupant(s)); });
      const left = unrankedItems().length;
      save.disabled = left > 0;
      form.dataset.complete = left ? "0" : "1";
      form.dataset.ranked = String(size - left);
      status.textContent = left
        ? "Ranked " + (size - left) + " of " + size + ": rank " + left + " more to save."
        : "All " + size + " ranked, best first: " + slots.map((s) => occupant(s).dataset.letter).join(" > ") +
          ". Enter saves.";
    }
    // The last completion has only one place left: it goes there.
    function fillLast() {
      const left = unrankedItems();
      const free = slots.filter((s) => !occupant(s));
      if (left.length === 1 && free.length === 1) free[0].appendChild(left[0]);
    }
    function focusNext(from) {
      const left = unrankedItems();
      const next = left.find((li) => items.indexOf(li) > items.indexOf(from)) || left[0];
      (next || from).focus();
    }
    // Put `li` at `place`; whoever was there takes li's old place (or goes back unranked).
    function placeAt(li, place) {
      const slot = slots[place - 1];
      if (!slot) return;
      const there = occupant(slot);
      if (there === li) return;
      const from = li.closest(".rank-slot");
      if (there) { if (from) from.appendChild(there); else backToPool(there); }
      slot.appendChild(li);
    }
    function backToPool(li) {
      // Back under its letter, in letter order.
      const after = Array.from(pool.children).find((c) => items.indexOf(c) > items.indexOf(li));
      pool.insertBefore(li, after || null);
    }
    function rank(li, place) {
      const wasUnranked = !placeOf(li);
      placeAt(li, place);
      fillLast();
      sync();
      if (wasUnranked) focusNext(li); else li.focus();
    }
    function rankFirstFree(li) {
      const free = slots.find((s) => !occupant(s));
      if (free) rank(li, Number(free.dataset.place));
    }
    function unrank(li) { backToPool(li); sync(); li.focus(); }
    function shift(li, step) {
      const place = placeOf(li);
      if (!place || !slots[place - 1 + step]) return;
      placeAt(li, place + step);
      sync();
      li.focus();
    }
    function submit() {
      if (unrankedItems().length) {
        status.textContent = "Rank every completion before saving: " + unrankedItems().length + " left (" +
          unrankedItems().map((li) => li.dataset.letter).join(", ") + ").";
        return;
      }
      form.requestSubmit(save);
    }

    form.addEventListener("click", (ev) => {
      const li = ev.target.closest(".rank-item");
      if (!li) return;
      if (ev.target.closest(".rank-up")) return shift(li, -1);
      if (ev.target.closest(".rank-down")) return shift(li, 1);
      if (ev.target.closest(".rank-out")) return unrank(li);
      if (ev.target.closest("a, summary, input, button")) return;
      if (!placeOf(li)) rankFirstFree(li);
    });
    form.addEventListener("keydown", (ev) => {
      if (ev.target.tagName === "INPUT" && ev.target.type !== "number") return; // the comment box
      if (ev.ctrlKey || ev.metaKey) return;
      const li = ev.target.closest && ev.target.closest(".rank-item");
      const done = () => { ev.preventDefault(); ev.stopPropagation(); };
      if (ev.key === "Enter") {
        if (ev.target.tagName === "BUTTON" || ev.target.tagName === "SUMMARY") return; // pressed as usual
        done();
        return submit();
      }
      if (!li) {
        if (/^[1-9]$/.test(ev.key)) done(); // not the page's rating keys while ranking
        return;
      }
      if (ev.altKey && (ev.key === "ArrowUp" || ev.key === "ArrowDown")) {
        done();
        return shift(li, ev.key === "ArrowUp" ? -1 : 1);
      }
      if (ev.altKey) return;
      if (/^[1-9]$/.test(ev.key)) {
        done();
        if (Number(ev.key) <= size) rank(li, Number(ev.key));
        else status.textContent = "There are " + size + " places: press 1 to " + Math.min(size, 9) + ".";
        return;
      }
      if (ev.key === " ") { done(); return placeOf(li) ? unrank(li) : rankFirstFree(li); }
      if (ev.key === "Backspace" || ev.key === "Delete" || ev.key === "0") { done(); if (placeOf(li)) unrank(li); return; }
      if (ev.key === "ArrowDown" || ev.key === "ArrowUp" || ev.key === "j" || ev.key === "k") {
        // Move focus in the order shown: the places first, then the unranked.
        done();
        const shown = slots.map(occupant).filter(Boolean).concat(Array.from(pool.children));
        const i = shown.indexOf(li) + (ev.key === "ArrowDown" || ev.key === "j" ? 1 : -1);
        if (shown[i]) shown[i].focus();
      }
    });
    // Drag onto a place, or back to the unranked ones.
    let dragged = null;
    items.forEach((li) => {
      li.addEventListener("dragstart", (ev) => { dragged = li; ev.dataTransfer.effectAllowed = "move"; li.classList.add("dragging"); });
      li.addEventListener("dragend", () => { li.classList.remove("dragging"); dragged = null; sync(); });
    });
    slots.forEach((slot) => {
      slot.addEventListener("dragover", (ev) => { if (dragged) { ev.preventDefault(); slot.classList.add("over"); } });
      slot.addEventListener("dragleave", () => slot.classList.remove("over"));
      slot.addEventListener("drop", (ev) => {
        ev.preventDefault();
        slot.classList.remove("over");
        if (dragged) { placeAt(dragged, Number(slot.dataset.place)); fillLast(); sync(); }
      });
    });
    pool.addEventListener("dragover", (ev) => { if (dragged) ev.preventDefault(); });
    pool.addEventListener("drop", (ev) => { ev.preventDefault(); if (dragged && placeOf(dragged)) { backToPool(dragged); sync(); } });

    form.addEventListener("submit", (ev) => {
      if (unrankedItems().length) {
        ev.preventDefault();
        ev.stopImmediatePropagation();
        submit();
      }
    }, true);
    form.addEventListener("htmx:confirm", (ev) => { if (unrankedItems().length) ev.preventDefault(); });
    sync();
    if (items[0]) items[0].focus({ preventScroll: window.matchMedia("(max-width: 700px)").matches });
  }

  function scan(root) { (root || document).querySelectorAll("form.rank").forEach(setup); }
  document.addEventListener("htmx:afterSwap", (ev) => scan(ev.detail.target));
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", () => scan()); else scan();
  window.rftRankSetup = scan;
})();
