// The runs list, live: a socket on /ws/runs/ says which of the user's runs changed (status,
// steps, buffer, people), and the rows are fetched again over HTTP, at most once a second,
// the last change always shown. While the socket is down the list polls every 5 s; without
// JavaScript the "refresh" link reloads it.
(function () {
  "use strict";
  var live = document.getElementById("runs-live");
  if (!live || !document.getElementById("runs")) return;
  // The rows as the page shows them now: a sort or filter picked since pushed its query.
  function url() { return live.dataset.rowsUrl.split("?")[0] + location.search; }
  var timer = null;
  var last = 0;
  var poll = null;
  var delay = 1000;
  var notices = 0;

  function refresh() {
    last = Date.now();
    // htmx.ajax, not a trigger on the table body: a body swapped in less than a settle ago
    // is not wired up yet, and would miss the event.
    if (window.htmx) window.htmx.ajax("GET", url(), { target: "#runs", swap: "outerHTML" });
  }
  function soon() {
    if (timer) return;
    timer = setTimeout(function () { timer = null; refresh(); }, Math.max(0, last + 1000 - Date.now()));
  }
  function polling(on) {
    if (on && !poll) poll = setInterval(refresh, 5000);
    if (!on && poll) { clearInterval(poll); poll = null; }
  }
  function state(name, text) { live.dataset.state = name; live.textContent = text; }

  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws;
    try {
      ws = new WebSocket(proto + location.host + live.dataset.ws);
    } catch (e) { // no websockets on the way (a proxy, a policy): poll
      polling(true);
      return state("polling", "refreshing every 5 s");
    }
    ws.onopen = function () {
      delay = 1000;
      polling(false);
      state("live", "live");
      refresh(); // what changed between the page and the socket
    };
    ws.onmessage = function (m) {
      var frame;
      try { frame = JSON.parse(m.data); } catch (e) { return; }
      if (frame.type !== "runs.changed") return;
      notices += 1;
      live.dataset.notices = String(notices);
      soon();
    };
    ws.onclose = function (e) {
      polling(true);
      state("polling", "reconnecting… (refreshing every 5 s meanwhile)");
      if (e.code === 4403) return state("polling", "refreshing every 5 s");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
