// The annotation page's client: the run's live stream over a WebSocket, the queue that
// grows as rollouts arrive, and the keyboard. Untrusted text from events is only ever set
// as textContent; item HTML comes from the server, which renders completions sanitised.
(function () {
  "use strict";
  const root = document.getElementById("annotate");
  if (!root) return;
  const queue = document.getElementById("queue");
  const panel = document.getElementById("panel");
  // The kinds as the page was rendered with them (apps.feedback.templatetags: kinds_for_script).
  const kindsData = document.getElementById("feedback-kinds");
  const kinds = kindsData ? JSON.parse(kindsData.textContent) : { labels: [], marks: {} };
  const feed = document.getElementById("live-feed");
  const statusEl = document.getElementById("live-status");
  const countEl = document.getElementById("live-count");
  const keys = document.getElementById("keys");
  let canAnnotate = root.dataset.canAnnotate === "1";
  let current = null;

  // ------------------------------------------------------------------ queue
  function cards() { return queue ? Array.from(queue.querySelectorAll(".item")) : []; }
  function openCards() { return cards().filter((c) => !c.classList.contains("done")); }
  function lastAssignment() {
    return cards().reduce((m, c) => Math.max(m, Number(c.dataset.assignment) || 0), 0);
  }
  function updateEmpty() {
    const empty = document.getElementById("queue-empty");
    if (empty) empty.hidden = openCards().length > 0;
  }
  // Finished cards: the last few stay (what was just done, and undo's context); older ones are
  // put away and counted, so the page's height does not grow with the time spent labelling.
  // When few open items are left, the queue tops itself up (the waiting count says more wait).
  const KEEP_DONE = 8; // a queue's worth (RFT_ANNOTATION_QUEUE_SIZE), each one line tall
  const TOP_UP_BELOW = 3;
  const finished = new Set();
  function tidyDone() {
    const done = cards().filter((c) => c.classList.contains("done"));
    let fresh = false;
    for (const c of done) {
      if (!finished.has(c.dataset.assignment)) { finished.add(c.dataset.assignment); fresh = true; }
    }
    for (const c of openCards()) finished.delete(c.dataset.assignment); // reopened by a withdrawal
    const away = done.slice(0, Math.max(0, done.length - KEEP_DONE));
    if (away.length) {
      away.forEach((c) => c.remove());
      const count = bump("done-away", away.length);
      const note = document.getElementById("done-note");
      if (note) note.hidden = count === 0;
    }
    if (fresh && openCards().length < TOP_UP_BELOW) loadMore();
  }
  function select(card) {
    if (current) current.classList.remove("current");
    current = card || null;
    if (current) {
      current.classList.add("current");
      current.scrollIntoView({ block: "nearest" });
    }
    root.dataset.current = current ? current.dataset.assignment : "";
  }
  function ensureCurrent() {
    if (!current || !current.isConnected || current.classList.contains("done")) select(openCards()[0]);
  }
  function move(step) {
    const open = openCards();
    if (!open.length) return select(null);
    const i = open.indexOf(current);
    select(open[Math.min(open.length - 1, Math.max(0, (i < 0 ? 0 : i + step)))]);
  }

  let loading = null;
  let again = false;
  // One fetch at a time; a burst of events while one runs costs one more fetch, not many.
  function loadMore() {
    if (!canAnnotate || !queue) return Promise.resolve();
    if (loading) { again = true; return loading; }
    const url = root.dataset.queueUrl + "?after=" + lastAssignment();
    loading = fetch(url, { headers: { "HX-Request": "true" }, credentials: "same-origin" })
      .then((r) => (r.ok ? r.text() : ""))
      .then((html) => {
        const tpl = document.createElement("template");
        tpl.innerHTML = html;
        // By id: an item's (item-N) or a card another app puts between items (apps/feedback/extras.py).
        const known = new Set(cards().map((c) => c.id));
        for (const card of Array.from(tpl.content.querySelectorAll(".item"))) {
          if (known.has(card.id)) continue;
          queue.appendChild(card);
          if (window.htmx) window.htmx.process(card);
        }
        updateEmpty();
        ensureCurrent();
      })
      .catch(() => {})
      .finally(() => {
        loading = null;
        if (again) { again = false; loadMore(); }
      });
    return loading;
  }
  const more = document.getElementById("load-more");
  if (more) more.addEventListener("click", (ev) => { ev.preventDefault(); loadMore(); });

  // ------------------------------------------------------------------ live stream
  const liveLine = document.getElementById("live-line");
  function note(text) {
    // One compact line for people; the raw feed stays folded away below.
    if (liveLine) {
      liveLine.removeAttribute("data-initial");
      liveLine.textContent = new Date().toLocaleTimeString() + " · " + text;
    }
    if (!feed) return;
    const li = document.createElement("li");
    li.textContent = text;
    feed.prepend(li);
    while (feed.children.length > 50) feed.lastElementChild.remove();
  }
  let newCount = 0;
  let backoff = 500;
  let connected = false;
  function connect() {
    const proto = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(proto + location.host + root.dataset.wsPath);
    ws.onopen = () => {
      backoff = 500;
      statusEl.textContent = "live";
      statusEl.classList.add("on");
      root.dataset.live = "open";
      loadMore(); // anything that arrived while we were away
      // Where the labels stand may have moved meanwhile (the ledger box polls nothing: the
      // events move it). Not on the first connect: the page was just drawn.
      if (connected) statesSoon();
      connected = true;
    };
    ws.onmessage = (msg) => {
      let frame;
      try { frame = JSON.parse(msg.data); } catch (e) { return; }
      // Under load the server sends several events, in order, as one "batch" frame.
      const events = frame.type === "batch" && Array.isArray(frame.events) ? frame.events : [frame];
      events.forEach(handle);
      // An event the page does not word (metrics, a heartbeat) still ends "Waiting for the
      // first event." (issue 64 item 10: it stayed while events came).
      if (liveLine && liveLine.hasAttribute("data-initial") && events.length) {
        note(String(events[events.length - 1].type || "event").replace(".", " "));
      }
    };
    function handle(ev) {
      const p = ev.payload || {};
      if (ev.type === "experience.created") {
        // One event per experience: {id, group_id, task_id, source, status, reward, ...}
        // (ExperienceDraft.event_payload, the same whoever wrote it).
        newCount += 1;
        countEl.textContent = String(newCount);
        note("new experience #" + p.id + (p.group_id ? " in group " + p.group_id : "") +
             (p.status === "pending" ? " (waits for feedback)" : ""));
        loadMore();
      } else if (ev.type === "feedback.saved") {
        counted(p);
        statesSoon();
        note((p.withdrawn ? "withdrawn: " : "feedback: ") + p.kind + (p.author ? " by " + p.author : "") +
             (p.late ? " (late)" : "") + (p.group_ready ? " · group trainable" : ""));
      } else if (ev.type === "weights.synced") {
        if (p.event === "published") statesSoon();
        note("model v" + p.version + " " + (p.event === "failed" ? "sync failed" : (p.event || "synced")));
      } else if (ev.type === "labels.changed") {
        statesSoon();
      } else if (ev.type === "run.status") {
        note("run " + p.status);
        statesSoon();
        refreshCounts();
        if (CLOSED_WHY[p.status]) closeQueue(p.status);
      }
    }
    ws.onclose = (ev) => {
      statusEl.textContent = ev.code === 4403 ? "not allowed" : "offline";
      statusEl.classList.remove("on");
      root.dataset.live = ev.code === 4403 ? "denied" : "closed";
      if (ev.code === 4403) return;
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 15000);
    };
  }
  connect();

  // A run that ends while the page is open takes no more feedback: say so and why, put the
  // queue away. A stopped run is closed as a finished one is (apps.runs.selectors.ENDED_STATUSES:
  // one rule for rating, Undo, Revise and the queue); the reasons are those of its _CLOSED_WHY.
  const CLOSED_WHY = {finished: "its training is done", failed: "it trains nothing until its owner starts it again",
                      stopped: "it trains nothing until its owner starts it again"};
  function closeQueue(status) {
    const closed = document.getElementById("annotate-closed");
    if (closed && closed.hidden) {
      closed.hidden = false;
      closed.insertBefore(document.createTextNode("This run is " + status + ": it takes no more feedback (" + CLOSED_WHY[status] +
                                                  "), so nothing waits here. "), closed.firstChild);
    }
    canAnnotate = false;
    root.dataset.canAnnotate = "0";
    const col = root.querySelector(".queue-col");
    if (col) col.hidden = true;
    select(null);
  }

  // ------------------------------------------------------------------ counters and marks
  const me = root.dataset.user || "";
  function bump(id, by) {
    const el = document.getElementById(id);
    if (el) el.textContent = String(Math.max(0, (Number(el.textContent) || 0) + by));
    return el ? Number(el.textContent) : 0;
  }
  // The header's counts come from the server (feedback/_counts.html polls); events move them
  // at once and ask it again, so the waiting count stays the one the other pages show. One
  // refresh for a burst (a swap mutates the queue several times), 300 ms after its last event;
  // rftRefresh (static/rftweb/refresh.js): an event that comes while the counts are on their
  // way is not lost when that answer replaces the refresh link.
  let countsTimer = 0;
  function refreshCounts() {
    clearTimeout(countsTimer);
    countsTimer = setTimeout(() => window.rftRefresh("#counts-refresh"), 300);
  }
  // Where the labels stand (apps.feedback.ledger), on every event that may move a state (a
  // label saved, a train step, a reward-model version, a review, the run's end): the ledger box
  // and "Your submissions" are asked for again, and the finished cards take their labels'
  // states from the list (cardStates). At most one refresh a second, the last event of a burst
  // always answered: a trainer stepping every second moves them once a second, not once an event.
  let statesTimer = 0;
  let statesAt = 0;
  function statesSoon() {
    if (statesTimer) return;
    statesTimer = setTimeout(() => {
      statesTimer = 0;
      statesAt = Date.now();
      window.rftRefresh("#ledger-refresh");
      // A label open for revising keeps its form: the revision's own answer redraws the list.
      if (!document.querySelector("#mine li.revising")) window.rftRefresh("#mine a.refresh");
    }, Math.max(300, 1000 - (Date.now() - statesAt)));
  }
  // A finished card shows the state of the label on its item, as "Your submissions" lists it
  // (the newest label with a state whose items include the card's).
  function cardStates() {
    if (!queue) return;
    const listed = Array.from(document.querySelectorAll("#mine li.submission"));
    queue.querySelectorAll(".item.done[data-experience]").forEach((card) => {
      const li = listed.find((l) => l.querySelector(".label-state") &&
                              (l.dataset.targets || "").split(" ").includes(card.dataset.experience));
      const shown = card.querySelector(".label-state");
      if (!li || !shown) return;
      const state = li.querySelector(".label-state");
      // Only a change is written: the queue's observer calls this again on what it writes.
      if (shown.dataset.state !== state.dataset.state) shown.dataset.state = state.dataset.state;
      if (shown.textContent !== state.textContent) shown.textContent = state.textContent;
    });
  }
  function counted(p) {
    const by = p.withdrawn ? -1 : 1;
    if (kinds.labels.includes(p.kind)) bump("feedback-count", by);
    if (p.late) bump("late-count", by);
    refreshCounts();
    if (!me || p.author !== me) return;
    if (kinds.labels.includes(p.kind)) {
      const done = bump("done-today", by);
      const bar = document.getElementById("target-bar");
      if (bar) bar.value = done;
    }
    // What I did to an item shows on its card: ranked, compared, corrected.
    if (!p.withdrawn && p.experience_id && kinds.marks[p.kind]) {
      const card = queue && queue.querySelector('.item[data-experience="' + p.experience_id + '"]');
      if (card) {
        card.classList.add("has-" + p.kind);
        const marks = card.querySelector(".marks");
        const label = kinds.marks[p.kind];
        if (marks && !marks.textContent.includes(label)) marks.textContent += " · " + label;
      }
    }
    // A withdrawal's own answer already redrew the list (with its message), and so did a
    // revision's (the list already shows the new label).
    // rftRefresh (static/rftweb/refresh.js): a label saved while the list is on its way is
    // not lost when that answer replaces the list's refresh link.
    if (!p.withdrawn && !document.querySelector('#mine li[data-feedback="' + p.id + '"]')) window.rftRefresh("#mine a.refresh");
  }

  // ------------------------------------------------------------------ htmx glue
  // A refused form (400 / 403) shows its message beside it: static/feedback/refused.js.
  // On a phone the page is one column and the panel sits under the queue: bring it into view
  // when it opens, and start with the guidelines folded (a tap opens them).
  const narrow = window.matchMedia("(max-width: 700px)");
  const guidelines = document.getElementById("guidelines");
  if (guidelines && narrow.matches) guidelines.open = false;
  document.body.addEventListener("htmx:afterSwap", (ev) => {
    if (ev.detail.target && ev.detail.target.id === "mine-box") cardStates();
    if (ev.detail.target === panel) {
      // Wire the new form now, not when the swap settles: a save clicked in between (a
      // ranking's, under load) went out as a plain POST and reloaded the page.
      if (window.htmx) window.htmx.process(panel);
      const area = panel.querySelector("textarea, input[type=number]");
      if (area) area.focus({ preventScroll: narrow.matches });
      if (narrow.matches) panel.scrollIntoView({ block: "start" });
    }
    updateEmpty();
    ensureCurrent();
  });
  document.body.addEventListener("htmx:oobAfterSwap", () => { updateEmpty(); ensureCurrent(); refreshCounts(); });
  // A withdrawn item whose finished card was put away (tidyDone) has nothing for its
  // out-of-band card to replace: before the answer is swapped, a placeholder for it goes at
  // the end of the queue, so it comes back there, open (and htmx finds its target, rather
  // than reporting an error).
  // A revised label's finished card (data-oob-if-present) only updates a card still shown:
  // one put away is dropped from the answer, rather than coming back at the end of the queue.
  document.body.addEventListener("htmx:beforeSwap", (ev) => {
    let html = ev.detail.serverResponse;
    if (!queue || typeof html !== "string" || html.indexOf("hx-swap-oob") < 0) return;
    if (html.indexOf("data-oob-if-present") >= 0) {
      const t = document.createElement("template");
      t.innerHTML = html;
      t.content.querySelectorAll("[data-oob-if-present]").forEach((el) => { if (!document.getElementById(el.id)) el.remove(); });
      html = ev.detail.serverResponse = t.innerHTML;
    }
    for (const m of html.matchAll(/<article[^>]*\bid="(item-\d+)"[^>]*\bhx-swap-oob=/g)) {
      if (document.getElementById(m[1])) continue;
      const holder = document.createElement("article");
      holder.id = m[1];
      holder.hidden = true;
      finished.delete(m[1].slice("item-".length));
      queue.appendChild(holder);
    }
  });
  // A keyed card's form (one vote at a time, above) takes keys again once its answer is in.
  document.body.addEventListener("htmx:afterRequest", (ev) => {
    const sent = ev.detail.elt && ev.detail.elt.closest && ev.detail.elt.closest("form.sending");
    if (sent) sent.classList.remove("sending");
  });
  // An undo puts the item back in my queue: fetch it. A refresh of "my submissions" sent
  // before the undo (or a revision) was answered would show the withdrawn one again: drop its answer.
  let withdrawnAt = 0;
  document.body.addEventListener("htmx:beforeRequest", (ev) => {
    if (ev.detail.elt && ev.detail.elt.matches && ev.detail.elt.matches("#mine a.refresh")) ev.detail.xhr.rftSentAt = Date.now();
  });
  document.body.addEventListener("htmx:beforeSwap", (ev) => {
    const sent = ev.detail.xhr && ev.detail.xhr.rftSentAt;
    if (sent && sent <= withdrawnAt) ev.detail.shouldSwap = false;
    // A refresh asked before Revise was pressed must not close the label opened for editing.
    if (sent && document.querySelector("#mine li.revising")) ev.detail.shouldSwap = false;
    // Stamped when the answer swaps in (the event's own element is the target, #mine-box;
    // the form that asked is the request's).
    const elt = ev.detail.requestConfig && ev.detail.requestConfig.elt;
    if (ev.detail.shouldSwap && elt && elt.closest && elt.closest("#undo, form.withdraw, form.revise")) withdrawnAt = Date.now();
  });
  document.body.addEventListener("htmx:afterRequest", (ev) => {
    const form = ev.detail.elt && ev.detail.elt.closest && ev.detail.elt.closest("#undo, form.withdraw, form.revise");
    if (!form) return;
    withdrawnAt = Date.now();
    // A revision leaves its item done: nothing comes back to the queue.
    if (ev.detail.successful && !form.matches("form.revise")) loadMore().then(refreshCounts);
  });
  // An outerHTML swap detaches the element the swap events fire on, and a swap can finish
  // after the events we listen to: watching the queue itself keeps one item current.
  if (queue) {
    // The waiting count too: a feedback.saved event can arrive before its card is swapped.
    new MutationObserver(() => { tidyDone(); updateEmpty(); ensureCurrent(); refreshCounts(); cardStates(); })
      .observe(queue, { childList: true, subtree: true, attributes: true, attributeFilter: ["class"] });
  }

  // ------------------------------------------------------------------ keyboard
  // htmx wires up swapped-in content only when the swap settles (htmx.config.defaultSettleDelay,
  // 20 ms later): a key pressed in between would submit the plain form or follow the plain
  // link, and leave the page. Processing is idempotent, so every key processes what it uses.
  function ready(el) {
    if (el && window.htmx) window.htmx.process(el.closest("form") || el);
    return el;
  }
  function currentForm() { return ready(current && current.querySelector("form.rate")); }
  function check(selector) {
    const form = currentForm();
    const input = form && form.querySelector(selector);
    if (!input) return;
    if (input.type === "checkbox") input.checked = !input.checked;
    else {
      form.querySelectorAll("input[type=radio]").forEach((r) => { r.checked = false; });
      input.checked = true;
    }
  }
  function click(selector) {
    const el = ready(current && current.querySelector(selector));
    if (el) el.click();
  }
  function toggleHelp() {
    if (!keys) return;
    if (keys.open) keys.close(); else keys.showModal();
  }
  document.addEventListener("keydown", (ev) => {
    if (ev.altKey || ev.metaKey || (ev.ctrlKey && ev.key !== "Enter")) return;
    const t = ev.target;
    const typing = t && (t.tagName === "TEXTAREA" || t.tagName === "SELECT" ||
      (t.tagName === "INPUT" && !["radio", "checkbox"].includes(t.type)));
    if (typing) {
      if (ev.key === "Escape") t.blur();
      // ready(): a panel htmx has swapped in but not yet processed would otherwise submit as a
      // plain form and reload the page (seen under load: the correction saved, its note lost).
      if (ev.key === "Enter" && ev.ctrlKey && t.form) { ev.preventDefault(); ready(t.form).requestSubmit(); }
      return;
    }
    if (keys && keys.open && ev.key !== "?" && ev.key !== "Escape") return;
    // An open comparison takes a / b / t (tie) before the item's own keys, unless the current
    // card has keys of its own (data-keys: a blind pair between the items, apps/evaluation).
    const ownKeys = current && current.isConnected && !current.classList.contains("done") && current.hasAttribute("data-keys");
    const cmp = ready(panel && panel.querySelector("form.compare"));
    if (cmp && !ownKeys && ["a", "b", "t"].includes(ev.key)) {
      const winner = { a: "a", b: "b", t: "tie" }[ev.key];
      const button = cmp.querySelector('button[name=winner][value="' + winner + '"]');
      if (button) { ev.preventDefault(); button.click(); }
      return;
    }
    if (ev.key === "z") {
      const undo = document.getElementById("undo");
      if (undo) { ev.preventDefault(); ready(undo).requestSubmit(); }
      return;
    }
    ensureCurrent();
    // A kind's panel opens on its key (its link on the card names it: feedback/_item.html); a
    // card's button that names a key is pressed by it (a blind pair's a / b / t / x).
    const keyed = 'a[data-key="' + ev.key + '"], button[data-key="' + ev.key + '"]';
    const panelLink = /^[a-z]$/.test(ev.key) && current && current.querySelector(keyed);
    if (panelLink) {
      const form = panelLink.closest("form");
      if (form && form.classList.contains("sending")) { ev.preventDefault(); return; }
      if (form) form.classList.add("sending");
      click(keyed); ev.preventDefault(); return;
    }
    switch (ev.key) {
      case "1": case "2": case "3": case "4": case "5":
        check('input[name=score][value="' + ev.key + '"]'); break;
      case "+": check('input[name=thumb][value="up"]'); break;
      case "-": check('input[name=thumb][value="down"]'); break;
      case "u": check('input[name=flags][value="unsafe"]'); break;
      case "b": check('input[name=flags][value="broken"]'); break;
      case "o": check('input[name=flags][value="off_task"]'); break;
      case "j": move(1); break;
      case "k": move(-1); break;
      case "s": { const f = ready(current && current.querySelector("form.skip")); if (f) f.requestSubmit(); break; }
      case "Enter": {
        if (t && t.tagName === "BUTTON") return; // the browser presses the focused button
        const f = currentForm();
        if (f) { ev.preventDefault(); f.requestSubmit(); }
        return;
      }
      case "?": toggleHelp(); break;
      default: return;
    }
    ev.preventDefault();
  });

  updateEmpty();
  ensureCurrent();
})();
