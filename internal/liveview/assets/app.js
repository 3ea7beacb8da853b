// fencelock live view: follows the page's event stream, counts TTLs down and held times up
// between updates on the database's clock, and sends forced releases after a confirmation.
"use strict";
(() => {
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
  const events = new EventSource(live.dataset.events);
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
  events.onerror = () => state("reconnecting");

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
})();
