"""The dashboard's page: one HTML document and its script, served by ``node/dashboard.py``.

Owns: the markup, the style and the vanilla script that polls ``/api/state`` every
``POLL_MS`` and draws the model (``core/dashboard_model.py``). No external asset: the page
works on a host with no network. Every value from the sessions (function and class names
are the user's) is written with ``textContent``, never as markup.
"""

from __future__ import annotations

POLL_MS = 1500

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>miniray dashboard</title>
<style>
body{font:14px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#222}
header{background:#1f3b57;color:#fff;padding:10px 18px;display:flex;gap:18px;align-items:center}
header h1{font-size:18px;margin:0}#status{font-size:12px;opacity:.85}
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:14px;padding:14px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:10px 14px}
section.wide{grid-column:1/-1}h2{font-size:15px;margin:2px 0 8px}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:3px 6px;
border-bottom:1px solid #eef0f2;font-size:13px}th{color:#555;font-weight:600}
.bar{background:#e7ebef;border-radius:3px;height:12px;position:relative;min-width:120px}
.fill{background:#3b82c4;height:100%;border-radius:3px}
.lane{position:relative;height:18px;background:#f1f3f5;margin:2px 0;border-radius:3px}
.task{position:absolute;top:2px;height:14px;border-radius:2px;background:#5aa469;
overflow:hidden;font-size:10px;color:#fff;white-space:nowrap}
.task.RUNNING{background:#d08a2c}.task.FAILED{background:#c44}
.lanes{display:grid;grid-template-columns:90px 1fr;gap:0 8px;align-items:center}
.muted{color:#888}
</style></head>
<body>
<header><h1>miniray dashboard</h1><span id="status">connecting...</span></header>
<main>
<section><h2>Nodes</h2><table id="nodes"></table></section>
<section><h2>Resources</h2><table id="resources"></table>
<h2>GPUs</h2><table id="gpus"></table></section>
<section><h2>Tasks (running and queued, by function)</h2><table id="tasks"></table></section>
<section><h2>Actors</h2><table id="actors"></table></section>
<section><h2>Object stores</h2><table id="stores"></table></section>
<section><h2>Waiting for resources</h2><table id="demands"></table></section>
<section class="wide"><h2>Timeline (recent tasks, one row per worker)</h2>
<div id="timeline" class="lanes"></div></section>
</main>
<script src="/app.js"></script>
</body></html>
"""

SCRIPT = """'use strict';
const BYTES = ['memory', 'object_store_memory'];
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function fill(id, head, rows, empty) {
  const t = document.getElementById(id);
  t.replaceChildren();
  if (!rows.length) {
    const r = el('tr'); r.appendChild(el('td', empty, 'muted')); t.appendChild(r); return;
  }
  const h = el('tr');
  head.forEach(x => h.appendChild(el('th', x)));
  t.appendChild(h);
  rows.forEach(cells => {
    const r = el('tr');
    cells.forEach(c => {
      const td = el('td');
      if (c instanceof Node) td.appendChild(c);
      else td.textContent = c === null || c === undefined ? '' : String(c);
      r.appendChild(td);
    });
    t.appendChild(r);
  });
}
function bar(percent) {
  const b = el('div', null, 'bar'); const f = el('div', null, 'fill');
  f.style.width = Math.max(0, Math.min(100, percent)) + '%'; b.appendChild(f); return b;
}
function bytes(n) {
  if (n === undefined || n === null) return '';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + ' ' + u[i];
}
function timeline(tl) {
  const box = document.getElementById('timeline');
  box.replaceChildren();
  if (!tl.bars.length) { box.appendChild(el('div', 'no task has run yet', 'muted')); return; }
  const span = Math.max(1, tl.end_ms - tl.start_ms);
  tl.pids.forEach(pid => {
    box.appendChild(el('div', 'pid ' + pid));
    const lane = el('div', null, 'lane');
    tl.bars.filter(b => b.pid === pid).forEach(b => {
      const t = el('div', b.name, 'task ' + b.state);
      t.style.left = (100 * (b.start_ms - tl.start_ms) / span) + '%';
      t.style.width = Math.max(0.3, 100 * (b.end_ms - b.start_ms) / span) + '%';
      t.title = b.name + ' (' + b.state + ', ' + (b.end_ms - b.start_ms) + ' ms)';
      lane.appendChild(t);
    });
    box.appendChild(lane);
  });
}
function draw(m) {
  fill('nodes', ['node', 'address', 'state'],
       m.nodes.map(n => [n.node_id.slice(0, 12), n.address, n.state]), 'no live session');
  fill('resources', ['resource', 'used', 'total', ''],
       m.resources.map(r => BYTES.includes(r.name)
         ? [r.name, bytes(r.used), bytes(r.total), bar(r.percent)]
         : [r.name, r.used, r.total, bar(r.percent)]), 'none');
  fill('gpus', ['#', 'id', 'used', 'free', '', 'device'],
       m.gpus.map(g => [g.index, g.id, g.used, g.free, bar(g.percent), g.device]), 'no GPU');
  fill('tasks', ['function', 'running', 'queued'],
       m.task_groups.map(g => [g.name, g.running, g.queued]), 'no task running or queued');
  fill('actors', ['class', 'state', 'pid', 'name'],
       m.actors.map(a => [a.class_name, a.state, a.pid, a.name]), 'no actor');
  fill('stores', ['driver pid', 'objects', 'in memory', 'spilled', 'capacity'],
       m.stores.map(s => [s.pid, s.objects, bytes(s.bytes_in_memory), bytes(s.bytes_spilled),
                          bytes(s.capacity)]), 'no driver');
  fill('demands', ['driver pid', 'function', 'shape', 'count'],
       m.demands.map(d => [d.pid, d.name, JSON.stringify(d.shape),
                           d.count + (d.infeasible ? ' (infeasible)' : '')]),
       'nothing waits');
  timeline(m.timeline);
  let s = 'updated ' + new Date(m.now_ms).toLocaleTimeString();
  if (m.missing.length) s += ' (no answer from: ' + m.missing.join('; ') + ')';
  if (m.error) s += ' - ' + m.error;
  document.getElementById('status').textContent = s;
}
async function poll() {
  try {
    const r = await fetch('/api/state', {credentials: 'same-origin', cache: 'no-store'});
    if (!r.ok) throw new Error('HTTP ' + r.status);
    draw(await r.json());
  } catch (e) {
    document.getElementById('status').textContent = 'cannot reach the dashboard: ' + e.message;
  }
  setTimeout(poll, POLL_MS);
}
poll();
"""
