// The new-run form: choosing an algorithm fills in its usual values (repeat times, learning
// rate, mode) for the fields the person has not edited themselves, and each folded box's
// line says what in it differs from the defaults as the person edits (the server writes the
// same line when it renders the form).
(function () {
  "use strict";
  var form = document.getElementById("run-form");
  var data = document.getElementById("algorithm-defaults");
  if (!form || !data) return;
  var defaults = JSON.parse(data.textContent);
  var touched = {};

  function valueOf(el) {
    if (el.type === "checkbox") return el.checked ? "on" : "";
    return el.value;
  }
  function said(text, limit) {
    var line = text.split(/\s+/).join(" ").trim();
    return line.length <= limit ? line : line.slice(0, limit - 1) + "…";
  }
  function summarise(section) {
    var out = [];
    section.querySelectorAll(".field[data-field]").forEach(function (box) {
      var el = box.querySelector("[name]");
      if (!el) return;
      var value = valueOf(el), dflt = el.dataset.default || "";
      if (value === dflt) return;
      var labelEl = box.querySelector("label");
      var label = labelEl ? labelEl.textContent.replace(/\s*\*$/, "") : el.name;
      if (el.type === "checkbox") out.push(label + " " + (value ? "on" : "off"));
      else if (el.tagName === "TEXTAREA") out.push(value ? label + ": " + said(value, 40) : label + " cleared");
      else out.push(label + " " + (value ? said(value, 24) : "(blank)"));
    });
    var line = section.querySelector("[data-summary]");
    if (line) line.textContent = out.length ? out.join(" · ") : (section.dataset.block === "optional" ? "off" : "defaults");
  }

  form.addEventListener("input", function (ev) {
    if (ev.target.name) touched[ev.target.name] = true;
    var section = ev.target.closest("details[data-form-section]");
    if (section) summarise(section);
  });
  var algorithm = form.querySelector('[name="algorithm"]');
  if (!algorithm) return;
  algorithm.addEventListener("change", function () {
    var values = defaults[algorithm.value] || {};
    Object.keys(values).forEach(function (name) {
      if (touched[name]) return;
      var el = form.querySelector('[name="' + CSS.escape(name) + '"]');
      if (el) el.value = values[name];
    });
    form.querySelectorAll("details[data-form-section]").forEach(summarise);
  });
})();
