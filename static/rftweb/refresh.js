// Refresh a fragment through its refresh link, whose answer replaces the link itself (hx-swap
// outerHTML, or a list that holds its own link). htmx queues a request that comes while the
// link's request is in flight on that link, then drops it once the answer has swapped the link
// out of the page: the second of two refreshes in quick succession was lost (the run page's
// timeline missed a load that came right after its version; "my submissions" missed a label,
// and a person's click on "refresh" while a live event's refresh was on its way did nothing,
// leaving the list as the earlier answer had read it).
// Here a refresh asked for while the same one is in flight, by a live event (rftRefresh), by
// a click on the link or by the link's own poll (data-every), runs once more after it, on the
// link then in the page.
(function () {
  "use strict";
  // One entry per fragment in flight, keyed by the link's address and target, so a live event's
  // refresh and a click on the same link are one refresh: "busy", or "again" to run once more.
  var state = {};

  function address(link) { return link.getAttribute("hx-get") || link.getAttribute("href"); }
  function keyOf(link) { return address(link) + " -> " + (link.getAttribute("hx-target") || ""); }

  function refresh(selector) {
    var link = document.querySelector(selector);
    if (!link || !window.htmx) return;
    var key = keyOf(link);
    if (state[key]) {
      state[key] = "again";
      return;
    }
    state[key] = "busy";
    function done() {
      var again = state[key] === "again";
      delete state[key];
      if (again) refresh(selector);
    }
    window.htmx.ajax("GET", address(link), { source: link }).then(done, done);
  }

  function selectorOf(link) { return 'a.refresh[hx-get="' + CSS.escape(link.getAttribute("hx-get")) + '"]'; }

  window.rftRefresh = refresh;
  // A click on a refresh link goes the same way (captured before htmx's own listener on the
  // link sees it), found again by its address when it runs once more. A click with a modifier
  // key opens the plain href, as a link should.
  document.addEventListener("click", function (ev) {
    var link = ev.target && ev.target.closest && ev.target.closest("a.refresh[hx-get]");
    if (!link || !window.htmx || ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.altKey) return;
    ev.preventDefault();
    ev.stopPropagation();
    refresh(selectorOf(link));
  }, true);

  // A refresh link with data-every="S" refreshes its fragment every S seconds, the same way (an
  // htmx "every Ss" trigger on the link was a request of the link's own, outside this
  // bookkeeping: a live event's refresh that came while the poll was in flight was dropped).
  // Each link polls until it leaves the page; its replacement polls on from its own arrival.
  function poll(link) {
    if (link.dataset.polling) return;
    link.dataset.polling = "1";
    var ms = Number(link.dataset.every) * 1000;
    function tick() {
      if (!link.isConnected) return;
      refresh(selectorOf(link));
      setTimeout(tick, ms);
    }
    setTimeout(tick, ms);
  }
  document.addEventListener("htmx:load", function (ev) {
    var root = ev.detail && ev.detail.elt;
    if (!root || !root.querySelectorAll) return;
    if (root.matches("a.refresh[hx-get][data-every]")) poll(root);
    root.querySelectorAll("a.refresh[hx-get][data-every]").forEach(poll);
  });
})();
