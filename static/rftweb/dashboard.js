// The run page, live: charts (uPlot) in sections, fed by the page's initial data and the
// run's websocket group; the header (status, steps, version, error), buffer counts, the sync
// timeline, worker errors and a one-line summary of what just happened follow the events.
// Everything from the server is inserted as text (textContent), never as HTML.
(function () {
  "use strict";
  var root = document.getElementById("charts");
  if (!root || typeof uPlot === "undefined") return;
  var initial = JSON.parse(document.getElementById("chart-data").textContent);
  var runId = root.dataset.run;
  var patterns = initial.charts.map(function (g) {
    return { id: g.id, title: g.title, section: g.section || "other", re: new RegExp(g.pattern, "i") };
  });
  var sections = initial.sections || [];
  var constantRe = new RegExp(initial.constant_pattern || "$^", "i");
  // The evaluation's bookkeeping among them: its own table (renderConstants), never a chart.
  var bookkeepingRe = /^eval[\/_.](version|tasks|best_version)$/i;
  var COLORS = ["#3558d4", "#d4553f", "#2a9d5b", "#b07d12", "#7a44c2", "#1e8fa8", "#c2447a", "#555"];

  // ------------------------------------------------------------------ state
  // runs[id] = {name, metrics: {name: Map(step -> {v, t})}}; this run first, then compared ones.
  var runs = {};
  var runOrder = [];
  function runEntry(id, name) {
    id = String(id);
    if (!runs[id]) { runs[id] = { id: id, name: name || ("#" + id), metrics: {} }; runOrder.push(id); }
    return runs[id];
  }
  var self = runEntry(runId, (initial.run && initial.run.name) || "this run");
  var view = { x: "step", smooth: 0 };
  var charts = {};      // chart id -> {id, title, section, el, area, plot, key}
  window.rftCharts = charts; // for the page tests and the curious

  function put(run, name, step, value, time) {
    var m = run.metrics[name];
    if (!m) { m = new Map(); run.metrics[name] = m; }
    m.set(Number(step), { v: Number(value), t: Number(time) || Date.now() / 1000 });
  }
  function loadSeries(run, series) {
    Object.keys(series || {}).forEach(function (name) {
      series[name].forEach(function (p) { put(run, name, p[0], p[1], p[2]); });
    });
  }

  // ------------------------------------------------------------------ layout
  function sectionEl(id) {
    var el = document.getElementById("section-" + id);
    if (el) return el;
    var info = sections.filter(function (s) { return s.id === id; })[0] || { id: id, title: id };
    el = document.createElement("section");
    el.className = "chart-section";
    el.id = "section-" + id;
    el.dataset.rank = String(sections.indexOf(info) < 0 ? 99 : sections.indexOf(info));
    var h = document.createElement("h2");
    h.textContent = info.title;
    var grid = document.createElement("div");
    grid.className = "chart-grid";
    el.appendChild(h);
    el.appendChild(grid);
    var after = Array.prototype.find.call(root.children, function (c) {
      return c.classList.contains("chart-section") && Number(c.dataset.rank) > Number(el.dataset.rank);
    });
    root.insertBefore(el, after || null);
    return el;
  }
  // A chart follows its box's width: a section's single chart spans the row, and a second
  // chart arriving in it, a turned phone or a resized window re-sizes the ones there.
  function plotWidth(el) { return Math.max(200, (el.clientWidth || 320) - 2); }
  function fitWidth(el, plotOf, height) {
    if (typeof ResizeObserver === "undefined") return;
    var last = 0;
    new ResizeObserver(function () {
      var plot = plotOf();
      var w = plotWidth(el);
      if (plot && Math.abs(w - last) > 4) { last = w; plot.setSize({ width: w, height: height }); }
    }).observe(el);
  }
  // A metric under what it measures ("accuracy (the domain's verifier)"), else its name.
  var labels = initial.labels || {};
  function seriesLabel(name) {
    if (labels[name]) return labels[name];
    if (/^eval\/preference\//.test(name)) return "preference share: " + name.slice("eval/preference/".length);
    return name;
  }
  function patternOf(name) {
    for (var i = 0; i < patterns.length; i++) if (patterns[i].re.test(name)) return patterns[i];
    return { id: "m-" + name.replace(/[^a-zA-Z0-9_-]/g, "_"), title: name, section: "other" };
  }
  function chartFor(id, title, section) {
    if (charts[id]) return charts[id];
    var box = document.createElement("div");
    box.className = "chart card";
    box.id = "chart-" + id;
    box.dataset.points = "0";
    var h = document.createElement("h3");
    h.textContent = title;
    var area = document.createElement("div");
    area.className = "plot";
    box.appendChild(h);
    box.appendChild(area);
    sectionEl(section).querySelector(".chart-grid").appendChild(box);
    charts[id] = { id: id, title: title, section: section, el: box, area: area, plot: null, key: "" };
    fitWidth(area, function () { return charts[id] && charts[id].plot; }, 180);
    return charts[id];
  }

  // ------------------------------------------------------------------ controls
  var bar = document.createElement("div");
  bar.className = "chart-controls";
  bar.innerHTML =
    '<label>x axis <select id="chart-x"><option value="step">step</option><option value="time">wall time</option></select></label>' +
    '<label>smoothing <input id="chart-smooth" type="range" min="0" max="0.95" step="0.05" value="0"> <output id="chart-smooth-value">0</output></label>' +
    '<span class="compare-pick"><label>compare with <select id="chart-compare"><option value="">choose a run…</option></select></label>' +
    ' <span id="chart-compared" class="compared"></span></span>' +
    '<span class="muted">drag on a chart to zoom, double-click to reset</span>';
  root.appendChild(bar);
  // "Compare with": a picker of the runs with data (the server offers no others); each run
  // picked shows as a chip that takes it off again.
  var compareSel = bar.querySelector("#chart-compare");
  var compared = bar.querySelector("#chart-compared");
  var compareNames = {};
  (initial.compare || []).forEach(function (r) {
    var o = document.createElement("option");
    o.value = String(r.id);
    o.textContent = r.name + " #" + r.id + (r.status && r.status !== "running" ? " (" + r.status + ")" : "");
    compareNames[String(r.id)] = r.name + " #" + r.id;
    compareSel.appendChild(o);
  });
  if (compareSel.options.length < 2) bar.querySelector(".compare-pick").hidden = true;
  var constants = document.createElement("div");
  constants.id = "constants";
  constants.className = "constants";
  root.appendChild(constants);

  bar.querySelector("#chart-x").addEventListener("change", function (ev) { view.x = ev.target.value; renderAll(true); });
  bar.querySelector("#chart-smooth").addEventListener("input", function (ev) {
    view.smooth = Number(ev.target.value);
    bar.querySelector("#chart-smooth-value").textContent = ev.target.value;
    renderAll(false);
  });
  var wanted = [];
  function drawCompared() {
    compared.textContent = "";
    wanted.forEach(function (id, i) {
      var chip = document.createElement("button");
      chip.type = "button";
      chip.className = "chip secondary small";
      chip.dataset.run = id;
      chip.style.borderColor = COLORS[(i + 1) % COLORS.length];
      chip.textContent = compareNames[id] + " ×";
      chip.title = "stop comparing with " + compareNames[id];
      chip.addEventListener("click", function () { setCompared(wanted.filter(function (w) { return w !== id; })); });
      compared.appendChild(chip);
    });
    Array.prototype.forEach.call(compareSel.options, function (o) { o.disabled = !!o.value && wanted.indexOf(o.value) >= 0; });
  }
  function setCompared(ids) {
    wanted = ids;
    drawCompared();
    Promise.all(wanted.map(function (id) {
      if (runs[id] && runs[id].loaded) return null;
      return fetch("/runs/" + id + "/metrics/", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (d) { if (d) { var e = runEntry(id, compareNames[id]); loadSeries(e, d.series); e.loaded = true; } });
    })).then(function () {
      runOrder = [runId].concat(wanted.filter(function (id) { return runs[id]; }));
      renderAll(true);
    });
  }
  compareSel.addEventListener("change", function () {
    var id = compareSel.value;
    compareSel.value = "";
    if (id && wanted.indexOf(id) < 0) setCompared(wanted.concat([id]));
  });

  // ------------------------------------------------------------------ rendering
  // A setting logged as a metric (learning rate, batch size, the evaluated version) is a
  // constant only while this run's values never changed: one that moved (a last, smaller
  // batch; the next evaluated version) is charted like any measurement instead.
  function isConstant(name) {
    if (bookkeepingRe.test(name)) return true;  // always in its table, never a chart
    if (!constantRe.test(name)) return false;
    var m = self.metrics[name];
    if (!m) return true;
    var first = null, same = true;
    m.forEach(function (p) { if (first === null) first = p.v; else if (p.v !== first) same = false; });
    return same;
  }
  function smoothed(values) {
    var a = view.smooth;
    if (!a) return values;
    var last = null;
    return values.map(function (v) {
      if (v === null) return null;
      last = last === null ? v : a * last + (1 - a) * v;
      return last;
    });
  }
  // Tick labels as people read them: integers for steps, a few significant digits otherwise.
  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2).replace("e+", "e");
    return String(Number(v.toPrecision(4)));
  }
  // The y axis is as wide as its longest label (a negative one too): uPlot's fixed default
  // cut the minus sign off labels such as -0.0015.
  var measure = document.createElement("canvas").getContext("2d");
  function axisSize(u, values, axisIdx, cycleNum) {
    var axis = u.axes[axisIdx];
    if (cycleNum > 1) return axis._size;
    var size = (axis.ticks.size || 0) + (axis.gap || 0) + 6;
    if (values && values.length) {
      measure.font = axis.font ? axis.font[0] : "12px system-ui, sans-serif";
      var widest = values.reduce(function (m, s) { return Math.max(m, measure.measureText(String(s)).width); }, 0);
      // The axis font is scaled by the device pixel ratio; sizes are in CSS pixels.
      size += widest / (uPlot.pxRatio || window.devicePixelRatio || 1);
    }
    return Math.ceil(size);
  }
  // One point in time would stretch the axis over years: show a minute either side.
  function timeRange(u, min, max) {
    if (min == null || max == null) { var now = Date.now() / 1000; return [now - 3600, now]; }
    return max - min < 60 ? [min - 60, max + 60] : [min, max];
  }
  // uPlot sizes a time axis from one point (or none) over years: pin it to the hour around.
  function pinTime(plot, xs) {
    if (xs.length > 1) return;
    var r = timeRange(plot, xs.length ? xs[0] : null, xs.length ? xs[0] : null);
    plot.setScale("x", { min: r[0], max: r[1] });
  }
  function stepIncrs() {
    var out = [];
    for (var p = 1; p <= 1e7; p *= 10) out.push(p, 2 * p, 5 * p);
    return out;
  }

  // A compared run's lines: dashed, each compared run its own dash.
  var DASHES = [[6, 3], [2, 3], [10, 3, 2, 3]];

  function seriesOf(chartId) {
    // Every (run, metric) pair that belongs on this chart.
    var out = [];
    runOrder.forEach(function (rid, ri) {
      var run = runs[rid];
      if (!run) return;
      Object.keys(run.metrics).sort().forEach(function (name) {
        if (isConstant(name) || patternOf(name).id !== chartId) return;
        out.push({ run: run, name: name, ri: ri });
      });
    });
    return out;
  }

  function render(chart) {
    var list = seriesOf(chart.id);
    var byX = new Map();
    list.forEach(function (s, i) {
      s.run.metrics[s.name].forEach(function (p, step) {
        var x = view.x === "time" ? p.t : step;
        var row = byX.get(x);
        if (!row) { row = {}; byX.set(x, row); }
        row[i] = p.v;
      });
    });
    var xs = Array.from(byX.keys()).sort(function (a, b) { return a - b; });
    var data = [xs];
    list.forEach(function (s, i) {
      data.push(smoothed(xs.map(function (x) { var v = byX.get(x)[i]; return v === undefined ? null : v; })));
    });
    var own = list.filter(function (s) { return s.run === self; });
    chart.el.dataset.points = String(own.length ? own[0].run.metrics[own[0].name].size : 0);
    chart.el.dataset.series = String(list.length);
    var key = view.x + "|" + list.map(function (s) { return s.run.id + ":" + s.name; }).join(",");
    // A zoomed chart keeps its range while points arrive (a double-click resets it).
    if (chart.plot && chart.key === key) { chart.plot.setData(data, !chart.zoomed); return; }
    if (chart.plot) chart.plot.destroy();
    chart.key = key;
    chart.zoomed = false;
    // Each metric keeps its own colour whether or not other runs are compared (shades of one
    // hue per run made every line of this run blue: issue 64 item 10); a compared run draws
    // the same metric in the same colour, dashed, and its legend entry names the run. A chart
    // of one metric colours the runs apart instead (its lines are then one per run).
    var metricNames = [];
    list.forEach(function (s) { if (metricNames.indexOf(s.name) < 0) metricNames.push(s.name); });
    var byRun = metricNames.length === 1;
    var series = [{ label: view.x === "time" ? "time" : "step", value: function (u, v) { return v === null ? "–" : (view.x === "time" ? new Date(v * 1000).toLocaleTimeString() : String(v)); } }];
    list.forEach(function (s) {
      var k = metricNames.indexOf(s.name);
      series.push({
        label: s.run === self ? seriesLabel(s.name) : seriesLabel(s.name) + " (" + s.run.name + ")",
        stroke: COLORS[(byRun ? s.ri : k) % COLORS.length],
        dash: s.run === self ? undefined : DASHES[(s.ri - 1) % DASHES.length],
        width: 1.5, spanGaps: true, points: { show: xs.length < 40 },
        value: function (u, v) { return fmt(v); },
      });
    });
    var width = plotWidth(chart.area);
    var xAxis = view.x === "time" ? {} : { incrs: stepIncrs(), values: function (u, ticks) { return ticks.map(function (t) { return String(Math.round(t)); }); } };
    chart.plot = new uPlot({
      width: width, height: 180, series: series,
      scales: { x: view.x === "time" ? { time: true, range: timeRange } : { time: false } },
      axes: [xAxis, { size: axisSize, values: function (u, ticks) { return ticks.map(fmt); } }],
      cursor: { drag: { x: true, y: false } },
      // A compared run's entries are dashed like its lines.
      legend: { live: true, markers: { dash: function (u, i) { return u.series[i].dash ? "dashed" : "solid"; } } },
      hooks: { setSelect: [function (u) { if (u.select.width > 0) chart.zoomed = true; }] },
    }, data, chart.area);
    chart.plot.over.addEventListener("dblclick", function () { chart.zoomed = false; });
  }

  // The table under the charts: the run's settings logged as metrics ("Constants"), and apart
  // from them the evaluation's bookkeeping (the version evaluated last, its task count, the best
  // version so far), which moves as the run goes: a best version is no constant (issue 64 item 10).
  function renderConstants() {
    var settings = [], evaluation = [];
    Object.keys(self.metrics).sort().forEach(function (name) {
      if (!isConstant(name)) return;
      var m = self.metrics[name];
      var steps = Array.from(m.keys()).sort(function (a, b) { return a - b; });
      (bookkeepingRe.test(name) ? evaluation : settings).push([name, m.get(steps[steps.length - 1]).v, steps[steps.length - 1]]);
    });
    constants.textContent = "";
    table("Constants", "constants-settings", ["Setting", "Value", "At step"], settings);
    table("Latest evaluation", "constants-eval", ["Measure", "Value", "At step"], evaluation);
  }
  function table(title, id, heads, rows) {
    if (!rows.length) return;
    var t = document.createElement("table");
    t.className = "table compact";
    t.id = id;
    var head = t.createTHead().insertRow();
    heads.forEach(function (x) { var th = document.createElement("th"); th.textContent = x; head.appendChild(th); });
    var body = t.createTBody();
    rows.forEach(function (r) {
      var tr = body.insertRow();
      tr.dataset.metric = r[0];
      [r[0], fmt(r[1]), String(r[2])].forEach(function (x) { tr.insertCell().textContent = x; });
    });
    var h = document.createElement("h3");
    h.textContent = title;
    constants.appendChild(h);
    constants.appendChild(t);
  }

  function ensureCharts() {
    runOrder.forEach(function (rid) {
      if (!runs[rid]) return;
      Object.keys(runs[rid].metrics).forEach(function (name) {
        if (isConstant(name)) return;
        var g = patternOf(name);
        chartFor(g.id, g.title, g.section);
      });
    });
  }
  function renderAll() {
    ensureCharts();
    Object.keys(charts).forEach(function (id) { if (charts[id].custom) charts[id].custom(); else render(charts[id]); });
    renderConstants();
  }

  // Feedback per minute and buffer by status are not step metrics: their x axis is time.
  function timeChart(id, title, section) {
    var chart = chartFor(id, title, section);
    chart.points = new Map();
    chart.names = [];
    chart.custom = function () {
      var xs = Array.from(chart.points.keys()).sort(function (a, b) { return a - b; });
      if (chart.perMinute && xs.length > 1) {
        // A count per minute: a minute without feedback is a zero, drawn as one.
        var full = [];
        for (var m = xs[0]; m <= xs[xs.length - 1] && full.length < 100000; m += 60) full.push(m);
        xs = full;
      }
      var data = [xs];
      chart.names.forEach(function (n) {
        data.push(xs.map(function (x) {
          var row = chart.points.get(x);
          var v = row ? row[n] : undefined;
          return v === undefined ? (chart.perMinute ? 0 : null) : v;
        }));
      });
      chart.el.dataset.points = String(xs.length);
      var key = chart.names.join(",");
      if (chart.plot && chart.key === key) { chart.plot.setData(data); pinTime(chart.plot, xs); return; }
      if (chart.plot) chart.plot.destroy();
      chart.key = key;
      var series = [{ label: "time" }];
      chart.names.forEach(function (n, i) { series.push({ label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, value: function (u, v) { return fmt(v); } }); });
      chart.plot = new uPlot({ width: plotWidth(chart.area), height: 180, series: series,
        scales: { x: { time: true, range: timeRange } }, axes: [{ space: 90 }, { size: axisSize, values: function (u, t) { return t.map(fmt); } }],
        legend: { live: true } }, data, chart.area);
      pinTime(chart.plot, xs);
    };
    chart.put = function (name, x, v) {
      if (chart.names.indexOf(name) < 0) chart.names.push(name);
      var row = chart.points.get(x);
      if (!row) { row = {}; chart.points.set(x, row); }
      row[name] = v;
    };
    return chart;
  }
  // A twin takes no labels: the server sends no feedback points (null) and no chart is drawn.
  var feedback = initial.feedback === null ? null : timeChart("feedback", "Feedback per minute", "feedback");
  if (feedback) { feedback.perMinute = true; feedback.names.push("feedback"); }
  function loadFeedback(rows) {
    if (!feedback || !rows) return;
    rows.forEach(function (r) { feedback.put("feedback", r[0], r[1]); });
  }
  var buffer = timeChart("buffer", "Buffer by status", "buffer");
  function loadCounts(counts) {
    var now = Math.floor(Date.now() / 1000);
    Object.keys(counts).forEach(function (status) { buffer.put(status, now, counts[status]); });
    var box = document.getElementById("buffer-counts");
    if (!box) return;
    Object.keys(counts).forEach(function (status) {
      var el = box.querySelector('[data-status="' + CSS.escape(status) + '"] b');
      if (el) el.textContent = String(counts[status]);
    });
  }

  // ------------------------------------------------------------------ weight sync
  // Version against time: the published versions as a stepped line, each explorer's loads as
  // marks of its own colour; versions no explorer loaded (a later one was) listed as skipped.
  var syncBox = document.getElementById("sync-chart");
  var syncPlot = null;
  var syncTimer = null;
  function drawSync(sync) {
    if (!syncBox || !sync) return;
    var workers = Object.keys(sync.loads || {}).sort();
    var xsSet = new Set();
    (sync.published || []).forEach(function (p) { xsSet.add(p[0]); });
    workers.forEach(function (w) { sync.loads[w].forEach(function (p) { xsSet.add(p[0]); }); });
    var xs = Array.from(xsSet).sort(function (a, b) { return a - b; });
    var pub = new Map((sync.published || []).map(function (p) { return [p[0], p[1]]; }));
    var data = [xs, xs.map(function (x) { return pub.has(x) ? pub.get(x) : null; })];
    workers.forEach(function (w) {
      var m = new Map(sync.loads[w].map(function (p) { return [p[0], p[1]]; }));
      data.push(xs.map(function (x) { return m.has(x) ? m.get(x) : null; }));
    });
    syncBox.dataset.versions = String((sync.published || []).length);
    syncBox.dataset.loads = String(workers.reduce(function (n, w) { return n + sync.loads[w].length; }, 0));
    var skipped = document.getElementById("sync-skipped");
    if (skipped) skipped.textContent = sync.skipped && sync.skipped.length ? "Skipped (no explorer loaded them): " + sync.skipped.map(function (v) { return "v" + v; }).join(", ") : "";
    if (!xs.length) { syncBox.textContent = "No versions published yet."; return; }
    var series = [{ label: "time" }, { label: "published", stroke: "#3558d4", width: 1.5, spanGaps: true, paths: uPlot.paths.stepped({ align: 1 }), points: { show: true, size: 5 } }];
    workers.forEach(function (w, i) {
      series.push({ label: w, stroke: COLORS[(i + 1) % COLORS.length], width: 0, paths: function () { return null; }, points: { show: true, size: 7, fill: COLORS[(i + 1) % COLORS.length] } });
    });
    if (syncPlot) syncPlot.destroy();
    syncBox.textContent = "";
    // Room between tick labels: times need ~90 px each, versions a line each (14 px labels
    // crowded each other on the default spacing in a 140 px tall chart).
    syncPlot = new uPlot({ width: plotWidth(syncBox), height: 160, series: series,
      scales: { x: { time: true, range: timeRange } },
      axes: [{ space: 90 }, { size: axisSize, space: 28, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
        values: function (u, t) { return t.map(function (v) { return "v" + v; }); } }],
      legend: { live: true } }, data, syncBox);
    pinTime(syncPlot, xs);
    window.rftSyncPlot = syncPlot;
  }
  function syncSoon() {
    if (syncTimer) return;
    syncTimer = setTimeout(function () {
      syncTimer = null;
      fetch("/runs/" + runId + "/metrics/?only=sync", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (d) { if (d) drawSync(d.sync); })
        .catch(function () {});
    }, 500);
  }
  drawSync(initial.sync);
  if (syncBox) fitWidth(syncBox, function () { return syncPlot; }, 160);

  // ------------------------------------------------------------------ header
  function text(id, value) { var el = document.getElementById(id); if (el && value !== undefined && value !== null) el.textContent = String(value); }
  function showRun(state) {
    if (!state) return;
    text("run-explore-step", state.explore_step);
    text("run-train-step", state.train_step);
    text("run-total-steps", state.total_steps);
    if (state.version !== undefined) text("run-version", "v" + state.version);
    if (state.status) {
      var badge = document.getElementById("run-status");
      if (badge && badge.textContent !== state.status) {
        badge.textContent = state.status;
        badge.className = "status status-" + state.status;
        refresh("#controls a.refresh");
      }
    }
    if (state.status && state.status !== "running") {
      // Only a running run waits for anything: a banner from before a failure, a stop or the
      // end must not stay under it (the server's box is empty for such a run too).
      document.querySelectorAll("#waiting .wait").forEach(function (el) { el.remove(); });
      var waiting = document.getElementById("waiting");
      if (waiting) waiting.classList.remove("has-waits");
    }
    if (state.status === "finished" || state.status === "failed" || state.status === "stopped") showSummary(state.status);
    var err = document.getElementById("run-error");
    if (err && state.error !== undefined) {
      err.hidden = !state.error;
      err.textContent = state.error ? (state.status || "") + ": " + state.error : "";
    }
  }

  // A fragment the server renders again, swapped in place (htmx), where the page has it.
  function swapIn(selector, url) {
    if (document.querySelector(selector) && window.htmx) window.htmx.ajax("GET", url, { target: selector, swap: "outerHTML" });
  }

  // The versions panel keeps the metric the owner picked there (else the run's default).
  function swapVersions() {
    var panel = document.getElementById("versions");
    if (!panel) return;
    var pick = document.getElementById("versions-best-by");
    var query = panel.hasAttribute("data-picked") && pick ? "?best_by=" + encodeURIComponent(pick.value) : "";
    swapIn("#versions", panel.dataset.url + query);
  }

  // A run that ends while the page is open: its summary appears, and a finished or failed
  // run no longer invites anyone to annotate it (the server renders the same on a reload).
  function showSummary(status) {
    // A finished, failed or stopped run takes no labels (apps.runs.selectors.ENDED_STATUSES).
    document.querySelectorAll("a.annotate-link, #human-loop-hint").forEach(function (el) { el.remove(); });
    var box = document.getElementById("summary");
    if (!box || !window.htmx || box.dataset.status === status) return;
    window.htmx.ajax("GET", "/runs/" + runId + "/summary/", { target: "#summary", swap: "outerHTML" }).then(function () {
      // The summary holds the labels, the twin, the blind evaluations and the versions: the
      // running page's own copies go (two "Blind evaluations", two #versions otherwise).
      var shown = document.getElementById("summary");
      if (!shown || shown.hidden) return;
      document.querySelectorAll("[data-until-summary]").forEach(function (el) { el.remove(); });
    });
  }

  loadSeries(self, initial.series);
  loadFeedback(initial.feedback);
  loadCounts(initial.counts);
  renderAll();

  // ------------------------------------------------------------------ live line
  var line = document.getElementById("live-line");
  var tally = { experiences: 0, feedback: 0 };
  function say(msg) {
    if (!line) return;
    line.removeAttribute("data-initial");
    line.textContent = new Date().toLocaleTimeString() + " · " + msg +
      " · since this page opened: " + tally.experiences + " experiences, " + tally.feedback + " feedback";
  }
  function logEvent(type, payload) {
    var log = document.getElementById("event-log");
    if (!log) return;
    var li = document.createElement("li");
    var t = JSON.stringify(payload);
    li.textContent = new Date().toLocaleTimeString() + " " + type + " " + (t.length > 160 ? t.slice(0, 160) + "…" : t);
    log.insertBefore(li, log.firstChild);
    while (log.children.length > 30) log.removeChild(log.lastChild);
  }

  // static/rftweb/refresh.js: a refresh asked for while one is in flight is not lost.
  function refresh(selector) { window.rftRefresh(selector); }

  // Counts and the header follow new experiences, steps and feedback even when nobody
  // publishes them: one small request at most every 2 s.
  var countsTimer = null;
  function countsSoon() {
    if (countsTimer) return;
    countsTimer = setTimeout(function () {
      countsTimer = null;
      fetch("/runs/" + runId + "/metrics/?only=counts", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (d) { if (d) { loadCounts(d.counts); buffer.custom(); showRun(d.run); } })
        .then(function () { refresh("#waiting a.refresh"); refresh("#labelling a.refresh"); refresh("#run-ledger a.refresh"); })
        .catch(function () {});
    }, 2000);
  }

  var handlers = {
    "run.metric": function (p) {
      Object.keys(p.values || {}).forEach(function (name) { put(self, name, p.step, p.values[name]); });
      renderAll();
      countsSoon();
      say("metrics at step " + p.step);
    },
    "run.status": function (p) {
      showRun({ status: p.status, error: p.error || "" });
      if (p.feedback && p.feedback.mode) text("run-feedback-mode", p.feedback.mode);
      refresh("#controls a.refresh");
      refresh("#audit-box a.refresh");
      countsSoon();
      say("run " + (p.status || "") + (p.action ? " (" + p.action + ")" : ""));
    },
    "weights.synced": function (p) {
      if (p.event === "published") { text("run-version", "v" + p.version); swapVersions(); }
      refresh("#timeline a.refresh");
      if (p.event === "failed") {
        // The versions' table says what failed and where: shown, not left folded away.
        var table = document.querySelector("details.sync-table");
        if (table) table.open = true;
        say("v" + p.version + " " + (p.method || "weight") + " sync failed (" + (p.stage || "") + ") on " +
            (p.worker || "a worker") + ": " + (p.message || ""));
        return;
      }
      syncSoon();
      countsSoon();
      say("v" + p.version + " " + (p.event === "loaded" ? "loaded by " + (p.worker || "an explorer") : "published"));
    },
    "buffer.counts": function (p) { loadCounts(p.counts || p); buffer.custom(); },
    // A train step consumed labelled groups, a reward-model version recorded what it learned
    // from, a label was reviewed or its group dropped (apps.runs.events.labels_changed_publish):
    // "Where the labels went" is asked for again, as after a label (feedback.saved)
    // (countsSoon: at most one refresh every 2 s, however fast the trainer steps.)
    "labels.changed": function (p) {
      countsSoon();
      say("labels changed" + (p.why ? ": " + p.why : ""));
    },
    "experience.created": function (p) {
      tally.experiences += Array.isArray(p.ids) ? p.ids.length : (Number(p.count) || 1);
      countsSoon();
      say("new experiences");
    },
    "feedback.saved": function (p) {
      tally.feedback += 1;
      countsSoon();
      if (feedback) {
        var minute = Math.floor(Date.now() / 60000) * 60;
        var row = feedback.points.get(minute);
        feedback.put("feedback", minute, (row && row.feedback ? row.feedback : 0) + 1);
        feedback.custom();
      }
      say("feedback: " + (p.kind || "") + (p.author ? " by " + p.author : ""));
    },
    // The run ended and its people were told (apps/control/notifications.py): the header's
    // unread badge is fetched again (it counts this person's notifications only).
    "notification.created": function (p) {
      fetch("/notifications/badge/", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          var old = document.getElementById("notifications-badge");
          if (!html || !old) return;
          var box = document.createElement("div");
          box.innerHTML = html.trim();
          if (box.firstElementChild) old.replaceWith(box.firstElementChild);
        })
        .catch(function () {});
      say("run " + (p.state || "ended") + ": its people were notified");
    },
    "worker.error": function (p) {
      refresh("#failures a.refresh");
      say((p.task || "task") + " failed on " + (p.worker || "a worker") + ": " + (p.exception || ""));
    },
    "worker.heartbeat": function () { refresh("#workers a.refresh"); },
    "eval.result": function (p) {
      // Its eval/… metrics came as run.metric; the header names the best version so far.
      var best = document.getElementById("run-eval-best");
      if (best && p.best_version !== undefined) {
        best.hidden = false;
        text("run-best-version", "v" + p.best_version);
        // The metric that chose it (the run's eval.best_by) and its value there.
        if (p.best_label !== undefined) text("run-best-metric", p.best_label);
        if (p.best_value !== undefined) text("run-best-value", Number(p.best_value).toFixed(3));
      }
      say("held-out evaluation of v" + p.version + " (best v" + p.best_version + ")");
      // The headline and the versions panel read the new evaluation (apps/control/headline.py).
      swapIn("#headline", "/runs/" + runId + "/headline/");
      swapVersions();
    },
  };

  // After every (re)connect, fetch what the page may have missed while not connected.
  function catchUp() {
    fetch("/runs/" + runId + "/metrics/", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d) return;
        loadSeries(self, d.series);
        loadFeedback(d.feedback);
        loadCounts(d.counts);
        showRun(d.run);
        renderAll();
      })
      .catch(function () {});
  }

  var live = document.getElementById("live");
  var delay = 1000;
  var reconnecting = false;
  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + root.dataset.ws);
    ws.onopen = function () {
      delay = 1000;
      live.dataset.state = "live";
      live.textContent = "live";
      catchUp();
      // Labels may have moved while the socket was down ("Where the labels went" polls nothing).
      if (reconnecting) refresh("#run-ledger a.refresh");
      reconnecting = true;
    };
    ws.onmessage = function (m) {
      var frame;
      try { frame = JSON.parse(m.data); } catch (e) { return; }
      // Under load the server sends several events, in order, as one "batch" frame.
      var events = frame.type === "batch" && Array.isArray(frame.events) ? frame.events : [frame];
      events.forEach(function (msg) {
        logEvent(msg.type, msg.payload);
        var h = handlers[msg.type];
        if (h) h(msg.payload || {});
        // An event no handler words (a heartbeat, the buffer's counts) still ends "Waiting for
        // the first event." (issue 64 item 10: it stayed while events came).
        if (line && line.hasAttribute("data-initial")) say(String(msg.type || "event").replace(".", " "));
      });
    };
    ws.onclose = function (e) {
      live.dataset.state = "reconnecting";
      live.textContent = e.code === 4403 ? "not allowed" : "reconnecting…";
      if (e.code === 4403) return;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    };
  }
  connect();
})();
