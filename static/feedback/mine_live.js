// "Your submissions" on a page of its own (feedback/standalone.html with the list): each label's
// state (apps.feedback.ledger) moves live, as on the annotation page. The run's stream says when
// a state may have moved (a label saved, a train step, a reward-model version, a review, the
// run's end: the events static/feedback/annotate.js answers); the list shown is asked for again
// through its refresh link (static/rftweb/refresh.js), at most once a second.
(function () {
  "use strict";
  const box = document.querySelector("[data-mine-ws]");
  if (!box || !window.WebSocket) return;
  const MOVES = ["feedback.saved", "labels.changed", "run.status"];
  let timer = 0;
  function soon() {
    if (timer) return;
    timer = setTimeout(() => {
      timer = 0;
      // A label open for revising keeps its form: the revision's own answer redraws the list.
      if (!document.querySelector("#mine li.revising")) window.rftRefresh("#mine a.refresh");
    }, 1000);
  }
  // A refresh on its way when Revise was pressed must not close the label opened for editing.
  document.body.addEventListener("htmx:beforeSwap", (ev) => {
    const elt = ev.detail.requestConfig && ev.detail.requestConfig.elt;
    if (elt && elt.matches && elt.matches("#mine a.refresh") && document.querySelector("#mine li.revising")) {
      ev.detail.shouldSwap = false;
    }
  });
  let delay = 1000;
  let opened = false;
  function connect() {
    const proto = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(proto + location.host + box.dataset.mineWs);
    ws.onopen = () => { delay = 1000; if (opened) soon(); opened = true; box.dataset.live = "open"; };
    ws.onmessage = (m) => {
      let frame;
      try { frame = JSON.parse(m.data); } catch (e) { return; }
      const events = frame.type === "batch" && Array.isArray(frame.events) ? frame.events : [frame];
      if (events.some((ev) => MOVES.includes(ev.type) ||
                      (ev.type === "weights.synced" && ev.payload && ev.payload.event === "published"))) soon();
    };
    ws.onclose = (ev) => {
      if (ev.code === 4403) return;
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 15000);
    };
  }
  connect();
})();
