// The experience browser's bulk bar (apps/control/bulk_views.py): "all on this page" ticks
// every row's box, "all matching the filter" stands for every page; the count says which.
// The form works without this script (the confirmation page counts what was sent).
(function () {
  "use strict";
  function update(form) {
    var count = form.querySelector("#bulk-count");
    if (!count) return;
    var matching = form.querySelector("#select-matching");
    var boxes = form.querySelectorAll("input[name=ids]");
    var ticked = form.querySelectorAll("input[name=ids]:checked").length;
    var page = form.querySelector("#select-page");
    if (page) page.checked = boxes.length > 0 && ticked === boxes.length;
    if (matching && matching.checked) {
      count.textContent = "all " + matching.dataset.matching + " matching selected";
    } else {
      count.textContent = ticked ? ticked + " selected" : "none selected";
    }
  }
  document.addEventListener("change", function (e) {
    var form = e.target.closest && e.target.closest("#bulk-form");
    if (!form) return;
    if (e.target.id === "select-page") {
      form.querySelectorAll("input[name=ids]").forEach(function (box) { box.checked = e.target.checked; });
      var matching = form.querySelector("#select-matching");
      if (!e.target.checked && matching) matching.checked = false;
    }
    if (e.target.id === "select-matching" && e.target.checked) {
      form.querySelectorAll("input[name=ids]").forEach(function (box) { box.checked = true; });
    }
    update(form);
  });
})();
