// Refresh a fragment through its hidden refresh link, whose answer replaces the link itself
// (hx-swap outerHTML, or a list that holds its own link). htmx queues a click that comes while
// the link's request is in flight on that link, then drops it once the answer has swapped the
// link out of the page: the second of two events in quick succession was lost (the run page's
// timeline missed a load that came right after its version; "my submissions" missed a label).
// Here a refresh asked for while the same one is in flight runs once more after it, on the
// link then in the page.
(function () {
  "use strict";
  var state = {};
  window.rftRefresh = function (selector) {
    if (state[selector]) {
      state[selector] = "again";
      return;
    }
    var link = document.querySelector(selector);
    if (!link || !window.htmx) return;
    state[selector] = "busy";
    function done() {
      var again = state[selector] === "again";
      delete state[selector];
      if (again) window.rftRefresh(selector);
    }
    window.htmx.ajax("GET", link.getAttribute("hx-get") || link.getAttribute("href"), { source: link }).then(done, done);
  };
})();
