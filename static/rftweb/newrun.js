// The new-run form: choosing an algorithm fills in its usual values (repeat times, learning
// rate, mode) for the fields the person has not edited themselves.
(function () {
  "use strict";
  var form = document.getElementById("run-form");
  var data = document.getElementById("algorithm-defaults");
  if (!form || !data) return;
  var defaults = JSON.parse(data.textContent);
  var touched = {};
  form.addEventListener("input", function (ev) { if (ev.target.name) touched[ev.target.name] = true; });
  var algorithm = form.querySelector('[name="algorithm"]');
  if (!algorithm) return;
  algorithm.addEventListener("change", function () {
    var values = defaults[algorithm.value] || {};
    Object.keys(values).forEach(function (name) {
      if (touched[name]) return;
      var el = form.querySelector('[name="' + CSS.escape(name) + '"]');
      if (el) el.value = values[name];
    });
  });
})();
