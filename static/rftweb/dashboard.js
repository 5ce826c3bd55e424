// The run page, live: charts (uPlot) fed by the page's initial data and the run's
// websocket group; status, version, buffer counts and the sync timeline follow the events.
// Everything from the server is inserted as text (textContent), never as HTML.
(function () {
  "use strict";
  var root = document.getElementById("charts");
  if (!root || typeof uPlot === "undefined") return;
  var initial = JSON.parse(document.getElementById("chart-data").textContent);
  var runId = root.dataset.run;
  var groups = initial.groups.map(function (g) { return { id: g.id, title: g.title, re: new RegExp(g.pattern, "i") }; });
  var charts = {};      // id -> chart state
  var order = [];
  var COLORS = ["#3558d4", "#d4553f", "#2a9d5b", "#b07d12", "#7a44c2", "#1e8fa8", "#c2447a", "#555"];

  // Known groups first in their listed order, then other metrics, then the time charts.
  function rankOf(id) {
    for (var i = 0; i < groups.length; i++) if (groups[i].id === id) return i;
    return id === "feedback" ? 1000 : id === "buffer" ? 1001 : 500;
  }

  function chartFor(id, title, xTime) {
    if (charts[id]) return charts[id];
    var box = document.createElement("div");
    box.className = "chart card";
    box.id = "chart-" + id;
    box.dataset.points = "0";
    box.dataset.rank = String(rankOf(id));
    var h = document.createElement("h3");
    h.textContent = title;
    var area = document.createElement("div");
    area.className = "plot";
    box.appendChild(h);
    box.appendChild(area);
    var after = Array.prototype.find.call(root.children, function (el) { return Number(el.dataset.rank) > rankOf(id); });
    root.insertBefore(box, after || null);
    var chart = { id: id, title: title, xTime: !!xTime, names: [], points: new Map(), el: box, area: area, plot: null };
    charts[id] = chart;
    order.push(id);
    return chart;
  }

  function groupOf(name) {
    for (var i = 0; i < groups.length; i++) if (groups[i].re.test(name)) return groups[i];
    return { id: "m-" + name.replace(/[^a-zA-Z0-9_-]/g, "_"), title: name };
  }

  function put(chart, name, x, value) {
    if (chart.names.indexOf(name) < 0) chart.names.push(name);
    var row = chart.points.get(x);
    if (!row) { row = {}; chart.points.set(x, row); }
    row[name] = value;
  }

  function addMetric(name, step, value) {
    var g = groupOf(name);
    var chart = chartFor(g.id, g.title, false);
    put(chart, name, Number(step), Number(value));
    return chart;
  }

  function render(chart) {
    var xs = Array.from(chart.points.keys()).sort(function (a, b) { return a - b; });
    var data = [xs];
    chart.names.forEach(function (n) {
      data.push(xs.map(function (x) { var v = chart.points.get(x)[n]; return v === undefined ? null : v; }));
    });
    chart.el.dataset.points = String(xs.length);
    var width = Math.max(260, chart.area.clientWidth || 320);
    if (chart.plot && chart.plot.series.length === chart.names.length + 1) {
      chart.plot.setData(data);
      return;
    }
    if (chart.plot) chart.plot.destroy();
    var series = [{ label: chart.xTime ? "time" : "step" }];
    chart.names.forEach(function (n, i) {
      series.push({ label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, points: { show: xs.length < 40 } });
    });
    chart.plot = new uPlot({
      width: width, height: 180, series: series,
      scales: { x: { time: chart.xTime } },
      legend: { live: false },
    }, data, chart.area);
  }

  function renderAll() { order.forEach(function (id) { render(charts[id]); }); }

  function loadSeries(series) {
    Object.keys(series).forEach(function (name) {
      series[name].forEach(function (p) { addMetric(name, p[0], p[1]); });
    });
  }

  // Feedback per minute and buffer by status are not step metrics: their x axis is time.
  var feedback = chartFor("feedback", "Feedback per minute", true);
  feedback.names.push("feedback");
  function loadFeedback(rows) { rows.forEach(function (r) { put(feedback, "feedback", r[0], r[1]); }); }
  var buffer = chartFor("buffer", "Buffer by status", true);
  function loadCounts(counts) {
    var now = Math.floor(Date.now() / 1000);
    Object.keys(counts).forEach(function (status) { put(buffer, status, now, counts[status]); });
    var box = document.getElementById("buffer-counts");
    if (!box) return;
    Object.keys(counts).forEach(function (status) {
      var el = box.querySelector('[data-status="' + CSS.escape(status) + '"] b');
      if (el) el.textContent = String(counts[status]);
    });
  }

  loadSeries(initial.series);
  loadFeedback(initial.feedback);
  loadCounts(initial.counts);
  renderAll();

  function logEvent(type, payload) {
    var log = document.getElementById("event-log");
    if (!log) return;
    var li = document.createElement("li");
    var text = JSON.stringify(payload);
    li.textContent = new Date().toLocaleTimeString() + " " + type + " " + (text.length > 160 ? text.slice(0, 160) + "…" : text);
    log.insertBefore(li, log.firstChild);
    while (log.children.length > 30) log.removeChild(log.lastChild);
  }

  function refresh(selector) {
    var link = document.querySelector(selector);
    if (link && window.htmx) window.htmx.trigger(link, "click");
  }

  // Buffer counts follow new experiences and feedback even when nobody publishes
  // buffer.counts: one small request at most every 2 s.
  var countsTimer = null;
  function countsSoon() {
    if (countsTimer) return;
    countsTimer = setTimeout(function () {
      countsTimer = null;
      fetch("/runs/" + runId + "/metrics/?only=counts", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (d) { if (d) { loadCounts(d.counts); render(buffer); } })
        .catch(function () {});
    }, 2000);
  }

  var handlers = {
    "run.metric": function (p) {
      var touched = {};
      Object.keys(p.values || {}).forEach(function (name) { touched[addMetric(name, p.step, p.values[name]).id] = true; });
      Object.keys(touched).forEach(function (id) { render(charts[id]); });
    },
    "run.status": function (p) {
      var badge = document.getElementById("run-status");
      if (badge && p.status) { badge.textContent = p.status; badge.className = "status status-" + p.status; }
      if (p.feedback && p.feedback.mode) document.getElementById("run-feedback-mode").textContent = p.feedback.mode;
      refresh("#controls a.refresh");
    },
    "weights.synced": function (p) {
      if (p.event === "published") document.getElementById("run-version").textContent = "v" + p.version;
      refresh("#timeline a.refresh");
    },
    "buffer.counts": function (p) { loadCounts(p.counts || p); render(buffer); },
    "experience.created": countsSoon,
    "feedback.saved": function () {
      countsSoon();
      var minute = Math.floor(Date.now() / 60000) * 60;
      var row = feedback.points.get(minute);
      put(feedback, "feedback", minute, (row && row.feedback ? row.feedback : 0) + 1);
      render(feedback);
    },
    "worker.heartbeat": function () { refresh("#workers a.refresh"); },
  };

  // After every (re)connect, fetch what the page may have missed while not connected.
  function catchUp() {
    fetch("/runs/" + runId + "/metrics/", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d) return;
        loadSeries(d.series);
        loadFeedback(d.feedback);
        loadCounts(d.counts);
        renderAll();
      })
      .catch(function () {});
  }

  var live = document.getElementById("live");
  var delay = 1000;
  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + root.dataset.ws);
    ws.onopen = function () {
      delay = 1000;
      live.dataset.state = "live";
      live.textContent = "live";
      catchUp();
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
