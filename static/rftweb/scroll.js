// A table wider than its box (.scroll-x, which scrolls sideways) says so: on a phone the runs
// list's Annotate column, the summary's Change / Best / at step and the twin table were past the
// right edge with no hint (issue 64 item 10). Marks each such box `data-overflows` (app.css
// shows the hint) at load, on resize and after every htmx swap.
(function () {
  "use strict";
  function mark() {
    document.querySelectorAll(".scroll-x").forEach(function (box) {
      var wide = box.scrollWidth > box.clientWidth + 1;
      if (wide) box.dataset.overflows = ""; else delete box.dataset.overflows;
    });
  }
  document.addEventListener("DOMContentLoaded", mark);
  window.addEventListener("resize", mark);
  document.addEventListener("htmx:afterSettle", mark);
  document.addEventListener("toggle", mark, true);  // a table in a <details> that opens
  window.rftScrollMark = mark;
})();
