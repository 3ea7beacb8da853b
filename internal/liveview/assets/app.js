// fencelock live view: follows the page's event stream, counts TTLs down and held times up
// between updates on the database's clock, and sends forced releases after a confirmation.
//
// The tabs of a browser share one event stream: over HTTP/1.1 a browser opens at most six
// connections per host and a stream holds one for good, so a stream per tab left the sixth
// tab unable to load. This script, run as a SharedWorker (no TLS needed, unlike HTTP/2, nor a
// secure context, unlike Web Locks), follows one stream of the pages its tabs show
// (events?page=A&page=B...) and relays each page's updates to the tabs of that page. Without
// SharedWorker, or if it fails to start, a tab follows a stream of its own.
"use strict";
(() => {
  if (typeof document === "undefined") return shareStream(); // run as the shared worker
  const live = document.getElementById("live");
  const state = (s) => { document.body.dataset.state = s; document.getElementById("state").textContent = s; };
  let offset = 0; // the database's clock minus this browser's, in ms, from the last update
  const fmt = (ms) => {
    const s = Math.max(ms, 0) / 1000;
    if (s < 60) return s.toFixed(1) + "s";
    const m = Math.floor(s / 60), h = Math.floor(m / 60);
    return h > 0 ? `${h}h${m % 60}m${Math.floor(s % 60)}s` : `${m}m${Math.floor(s % 60)}s`;
  };
  const sync = () => {
    const n = live.querySelector("[data-now]");
    if (n) offset = Number(n.dataset.now) - Date.now();
  };
  const tick = () => {
    const now = Date.now() + offset;
    for (const el of live.querySelectorAll("[data-until]")) el.textContent = fmt(Number(el.dataset.until) - now);
    for (const el of live.querySelectorAll("[data-since]")) el.textContent = fmt(now - Number(el.dataset.since));
  };
  sync();
  setInterval(tick, 200);
  state("connecting");
  // events dispatches "update" (data: the page's live part) and "error", from the shared
  // stream or the page's own.
  const events = new EventTarget();
  const relay = (data) => events.dispatchEvent(data === undefined ? new Event("error") : new MessageEvent("update", { data }));
  const own = () => {
    const es = new EventSource(live.dataset.events);
    es.addEventListener("update", (e) => relay(e.data));
    es.onerror = () => relay();
  };
  const poll = (root) => Number(root.querySelector("[data-poll]")?.dataset.poll ?? -1);
  let worker = null;
  try {
    worker = typeof SharedWorker === "function" ? new SharedWorker(document.currentScript.src, { name: "fencelock live view" }) : null;
  } catch {
    worker = null;
  }
  if (worker) {
    const hello = () => worker.port.postMessage({ events: new URL(live.dataset.events, location.href).href });
    worker.port.onmessage = (m) => {
      const { data, cached, error } = m.data;
      if (error) return relay();
      // The worker's last update of this page may be a poll older than the page as served.
      if (cached) {
        const t = document.createElement("template");
        t.innerHTML = data;
        if (poll(t.content) < poll(live)) return state("live");
      }
      relay(data);
    };
    worker.onerror = () => { // the worker did not start: a stream of the page's own
      worker = null;
      own();
    };
    hello();
    addEventListener("pagehide", () => worker?.port.postMessage({ bye: true }));
    addEventListener("pageshow", (e) => { if (e.persisted && worker) hello(); });
  } else own();
  // An update changes only the nodes that differ, so that a button being pressed, the focus
  // and a selection survive it; children with a data-key are matched by key, not by place.
  const key = (n) => (n.nodeType === 1 ? n.getAttribute("data-key") : null);
  const morph = (from, to) => {
    for (const a of [...from.attributes]) if (!to.hasAttribute(a.name)) from.removeAttribute(a.name);
    for (const a of to.attributes) if (from.getAttribute(a.name) !== a.value) from.setAttribute(a.name, a.value);
    morphChildren(from, to);
  };
  const morphChildren = (from, to) => {
    const next = [...to.childNodes];
    next.forEach((t, i) => {
      let f = from.childNodes[i];
      const k = key(t);
      if (k !== null && (!f || key(f) !== k)) {
        // Only among the nodes not placed yet: keys are unique within a list.
        const m = [...from.childNodes].slice(i).find((c) => key(c) === k);
        if (m) {
          from.insertBefore(m, f || null);
          f = m;
        }
      }
      if (!f) from.appendChild(t);
      else if (f.isEqualNode(t)) return;
      else if (f.nodeType === 1 && f.nodeName === t.nodeName && key(f) === k) morph(f, t);
      else if (f.nodeType === 3 && t.nodeType === 3) f.nodeValue = t.nodeValue;
      else from.replaceChild(t, f);
    });
    while (from.childNodes.length > next.length) from.lastChild.remove();
  };
  events.addEventListener("update", (e) => {
    const t = document.createElement("template");
    t.innerHTML = e.data;
    morphChildren(live, t.content);
    sync();
    tick();
    state("live");
  });
  events.addEventListener("error", () => state("reconnecting"));

  const dialog = document.getElementById("confirm");
  if (!dialog) return; // a read-only view
  const status = document.getElementById("status");
  const csrf = document.querySelector('meta[name="fencelock-csrf"]').content;
  let target = null;
  document.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-release]");
    if (!b) return;
    target = { name: b.dataset.name, holder: b.dataset.holder, token: b.dataset.token };
    document.getElementById("c-name").textContent = target.name;
    document.getElementById("c-holder").textContent = target.holder;
    document.getElementById("c-token").textContent = target.token;
    dialog.showModal();
  });
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "release" || !target) return;
    const body = new URLSearchParams(target);
    for (const r of document.getElementById("c-fence").value.split(",")) if (r.trim()) body.append("fence", r.trim());
    const headers = { "X-Fencelock-CSRF": csrf };
    const secret = document.getElementById("c-secret").value;
    if (secret) headers.Authorization = "Bearer " + secret;
    target = null;
    try {
      const resp = await fetch("release", { method: "POST", headers, body, credentials: "same-origin" });
      const j = await resp.json().catch(() => ({ message: resp.statusText }));
      status.textContent = j.message;
      status.className = resp.ok ? "ok" : "err";
    } catch (err) {
      status.textContent = "forced release not sent: " + err;
      status.className = "err";
    }
  });

  // shareStream runs in the shared worker: a tab's port posts {events: URL} (the events URL of
  // its page) on arrival and {bye: true} on leaving; the worker holds one EventSource for
  // the pages wanted and posts each tab its page's updates ({data}, {data, cached: true} for
  // the last one on arrival) and the stream's errors ({error: true}).
  function shareStream() {
    const tabs = new Map(); // port → the key of its page: JSON of [page, name]
    const last = new Map(); // key → its last update on the current stream
    let es = null;
    let keys = []; // of es, in the order asked: page i's events are "update i"
    let broken = false; // an error since the last update
    let shrink = 0;
    const post = (key, msg) => { for (const [port, k] of tabs) if (k === key) port.postMessage(msg); };
    // follow opens a stream of the pages wanted if they differ from those of the current one.
    const follow = () => {
      const want = [...new Set(tabs.values())];
      if (want.length === keys.length && want.every((k) => keys.includes(k))) return;
      es?.close();
      es = null;
      keys = want;
      last.clear();
      broken = false;
      if (!want.length) return;
      const q = new URLSearchParams();
      for (const k of want) {
        const [page, name] = JSON.parse(k);
        q.append("page", page);
        if (page === "name") q.append("n", name);
      }
      const s = (es = new EventSource("events?" + q));
      want.forEach((k, i) => s.addEventListener(want.length === 1 ? "update" : "update " + i, (e) => {
        broken = false;
        last.set(k, e.data);
        post(k, { data: e.data });
      }));
      s.onerror = () => {
        broken = true;
        for (const k of want) post(k, { error: true });
      };
    };
    // A page no tab shows any more leaves the stream a little later: tabs that close
    // together, or a tab that goes to another page, reopen it once.
    const leave = (port) => {
      tabs.delete(port);
      clearTimeout(shrink);
      shrink = setTimeout(follow, 1000);
    };
    self.onconnect = (c) => {
      const port = c.ports[0];
      port.onmessage = (m) => {
        if (m.data.bye) return leave(port);
        const q = new URL(m.data.events).searchParams;
        const k = JSON.stringify([q.get("page"), q.get("page") === "name" ? q.get("n") : ""]);
        tabs.set(port, k);
        if (broken) port.postMessage({ error: true });
        else if (last.has(k)) port.postMessage({ data: last.get(k), cached: true });
        follow();
      };
      port.addEventListener("close", () => leave(port)); // where MessagePort has it (a tab gone without pagehide)
    };
  }
})();
