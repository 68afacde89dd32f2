#include "tools/server/pages.h"

namespace tandem::server {

std::string_view chat_page() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tandem chat</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:15px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
 header{padding:10px 16px;background:#1d2330;color:#fff;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
 header a{color:#9cc3ff} #status{margin-left:auto;font-size:13px}
 #keybox{display:none;gap:6px;align-items:center;font-size:13px} #keybox input{font:inherit;padding:3px 6px;width:180px}
 #log{max-width:860px;margin:16px auto;padding:0 16px}
 .msg{background:#fff;border-radius:8px;padding:10px 14px;margin:10px 0;white-space:pre-wrap;box-shadow:0 1px 2px #0002}
 .user{background:#e6f0ff} .meta{font-size:12px;color:#667;margin-top:6px;white-space:normal}
 .error{color:#b00020;font-weight:600;font-size:13px;margin-top:6px;white-space:normal}
 form{max-width:860px;margin:0 auto 24px;padding:0 16px;display:flex;gap:8px;flex-wrap:wrap}
 textarea{flex:1;min-width:220px;font:inherit;padding:8px;border-radius:6px;border:1px solid #bbb;min-height:48px}
 button{font:inherit;padding:8px 16px;border-radius:6px;border:0;background:#2f6fde;color:#fff;cursor:pointer}
 button#stop{background:#b00020} button:disabled{opacity:.5;cursor:default}
 label{font-size:13px;color:#445} details{max-width:860px;margin:0 auto 8px;padding:0 16px;font-size:13px}
 #system{width:100%;min-height:36px;font:inherit;box-sizing:border-box}
</style></head>
<body>
<header><b>tandem</b><span>chat (the model's chat template)</span><a href="/dashboard">dashboard</a>
<span id="keybox">API key <input id="key" type="password" autocomplete="off"><button id="savekey" type="button">Use</button></span>
<span id="status">connecting…</span></header>
<div id="log"></div>
<details><summary>settings</summary><label>system prompt<br><textarea id="system" placeholder="(none)"></textarea></label></details>
<form id="f"><textarea id="prompt" placeholder="Say something (Enter sends, Shift+Enter for a new line)">Once upon a time</textarea>
<div><label>max tokens <input id="max" type="number" value="64" min="1" style="width:70px"></label><br>
<label>temperature <input id="temp" type="number" value="0" step="0.1" min="0" max="2" style="width:70px"></label><br>
<label><input id="raw" type="checkbox"> raw completion</label><br>
<button id="send" type="submit">Send</button> <button id="stop" type="button" disabled>Stop</button></div></form>
<script>
const log = document.getElementById('log'), status = document.getElementById('status');
const keybox = document.getElementById('keybox'), keyInput = document.getElementById('key');
const stopButton = document.getElementById('stop');
const live = {};
let next = 1, ws = null, retry = 500;
// The conversation so far: each send carries it as 'messages' (after the system prompt, if
// any), which the server renders with the model's chat template; 'raw completion' sends the
// text alone as a prompt instead.
const history = [];
function apiKey() { return new URLSearchParams(location.search).get('api_key') || localStorage.getItem('tandem_api_key') || ''; }
function setStatus(t) { status.textContent = t; }
function showError(r, text) {
  const e = document.createElement('div'); e.className = 'error'; e.textContent = text; r.box.appendChild(e);
}
function finish(id) { delete live[id]; stopButton.disabled = Object.keys(live).length === 0; }
// Does the server want a key (and is ours right)? Asked over HTTP first: a refused WebSocket
// upgrade only shows as a closed socket.
async function connect() {
  setStatus('connecting…');
  const key = apiKey();
  let r;
  try {
    r = await fetch('/v1/models', { headers: key ? { Authorization: 'Bearer ' + key } : {} });
  } catch (e) { return later(); }
  if (r.status === 401) {
    keybox.style.display = 'flex';
    setStatus(key ? 'the API key was refused' : 'this server wants an API key');
    return;
  }
  keybox.style.display = 'none';
  ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws' + (key ? '?api_key=' + encodeURIComponent(key) : ''));
  ws.onopen = () => { retry = 500; setStatus('connected'); };
  ws.onclose = () => {
    for (const id of Object.keys(live)) { showError(live[id], 'error: the connection closed before the answer ended'); live[id].box.dataset.done = '1'; finish(id); }
    later();
  };
  ws.onmessage = onFrame;
}
// The socket dropped (or the server is away): try again, waiting longer each time (up to 10 s).
function later() {
  setStatus('disconnected: reconnecting in ' + (retry / 1000).toFixed(1) + ' s');
  setTimeout(connect, retry);
  retry = Math.min(retry * 2, 10000);
}
document.getElementById('savekey').onclick = () => { localStorage.setItem('tandem_api_key', keyInput.value); connect(); };
function onFrame(m) {
  const f = JSON.parse(m.data), r = live[f.id];
  if (!r) return;
  if (f.type === 'token') {
    if (r.t0 && !r.first) { r.first = performance.now(); }
    r.body.textContent += f.text;
    r.count++;
    const ttft = r.first ? (r.first - r.t0).toFixed(0) : '…';
    const tpot = r.count > 1 ? ((performance.now() - r.first) / (r.count - 1)).toFixed(1) : '…';
    r.meta.textContent = 'TTFT ' + ttft + ' ms · TPOT ' + tpot + ' ms · ' + r.count + ' tokens';
  } else if (f.type === 'done') {
    if (r.chat) history.push({role: 'assistant', content: r.body.textContent});
    const t = f.timings;
    r.meta.textContent = 'TTFT ' + t.ttft_ms.toFixed(1) + ' ms · TPOT ' + t.tpot_ms.toFixed(2) + ' ms · ' +
      f.usage.completion_tokens + ' tokens · queue ' + t.queue_ms.toFixed(1) + ' ms · total ' + t.e2e_ms.toFixed(0) +
      ' ms · KV ' + t.kv_bytes + ' B in ' + t.kv_transfer_ms.toFixed(2) + ' ms · ' + f.finish_reason;
    r.box.dataset.done = '1';
    finish(f.id);
  } else if (f.type === 'error') {
    if (r.chat) history.pop();  // the turn that failed is not part of the conversation
    r.meta.textContent = '';
    showError(r, 'error: ' + f.code + ': ' + f.message);
    r.box.dataset.done = '1';
    finish(f.id);
  }
}
function send() {
  const text = document.getElementById('prompt').value;
  if (!text.trim() || !ws || ws.readyState !== 1) return;
  const u = document.createElement('div'); u.className = 'msg user'; u.textContent = text; log.appendChild(u);
  const box = document.createElement('div'); box.className = 'msg answer';
  const body = document.createElement('span'); body.className = 'text';
  const meta = document.createElement('div'); meta.className = 'meta'; meta.textContent = 'waiting…';
  box.appendChild(body); box.appendChild(meta); log.appendChild(box);
  const id = 'c' + (next++);
  const chat = !document.getElementById('raw').checked;
  live[id] = {box, body, meta, chat, t0: performance.now(), first: 0, count: 0};
  stopButton.disabled = false;
  const frame = {type: 'generate', id, max_tokens: parseInt(document.getElementById('max').value, 10),
    temperature: parseFloat(document.getElementById('temp').value)};
  if (chat) {
    history.push({role: 'user', content: text});
    const system = document.getElementById('system').value.trim();
    frame.messages = (system ? [{role: 'system', content: system}] : []).concat(history);
  } else {
    frame.prompt = text;
  }
  ws.send(JSON.stringify(frame));
  document.getElementById('prompt').value = '';
}
document.getElementById('f').onsubmit = (e) => { e.preventDefault(); send(); };
document.getElementById('prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
});
// Stop: cancels every answer in flight (the server ends each with finish_reason "cancelled").
stopButton.onclick = () => { for (const id of Object.keys(live)) ws.send(JSON.stringify({type: 'cancel', id})); };
connect();
</script></body></html>
)HTML";
}

std::string_view dashboard_page() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tandem dashboard</title>
<style>
 body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
 header{padding:10px 16px;background:#1d2330;color:#fff;display:flex;gap:16px} header a{color:#9cc3ff}
 main{padding:16px;max-width:1100px;margin:auto}
 .tree{font-family:ui-monospace,monospace;background:#fff;padding:12px;border-radius:8px;box-shadow:0 1px 2px #0002}
 table{border-collapse:collapse;width:100%;background:#fff;margin-top:16px;box-shadow:0 1px 2px #0002}
 th,td{padding:6px 10px;border-bottom:1px solid #e3e6ea;text-align:right} th:first-child,td:first-child{text-align:left}
 .bar{display:inline-block;height:8px;background:#2f6fde;vertical-align:middle}
 #updated{margin-left:auto;font-size:12px;color:#ccd}
</style></head>
<body><header><b>tandem</b><span>live supervision tree</span><a href="/">chat</a><span id="updated">waiting for the feed…</span></header>
<main><div class="tree" id="tree"></div>
<table><thead><tr><th>worker</th><th>sequences / max batch</th><th>KV used / total</th><th>reserved</th><th>steps</th></tr></thead><tbody id="workers"></tbody></table>
<table><thead><tr><th>request actor</th><th>state</th><th>prefill worker</th><th>decode worker</th><th>prompt tokens</th><th>max tokens</th></tr></thead><tbody id="requests"></tbody></table>
<table><thead><tr><th>metric</th><th>value</th></tr></thead><tbody id="metrics"></tbody></table></main>
<script>
const tree = document.getElementById('tree'), rows = document.getElementById('workers'), mrows = document.getElementById('metrics');
const rrows = document.getElementById('requests');
function esc(s) { return String(s).replace(/[&<>]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;'})[c]); }
function show(s) {
  const pools = {};
  for (const w of s.workers) { const kind = w.name.split('-')[0]; (pools[kind] = pools[kind] || []).push(w); }
  const restarts = {}, degraded = {};
  for (const c of ((s.metrics || {}).counters || {}).tandem_restarts_total || []) restarts[c.labels.kind] = c.value;
  for (const g of ((s.metrics || {}).gauges || {}).tandem_pool_degraded || []) degraded[g.labels.pool] = g.value > 0;
  const r = s.router || {requests: {}, listed: []};
  const states = Object.entries(r.requests).filter(([, n]) => n > 0).map(([k, n]) => k + ' ' + n).join(', ') || 'none';
  let t = 'pipeline (' + esc(s.mode) + ', model ' + esc(s.model) + ')\n';
  t += '├─ router: queues prefill ' + r.prefill_queue + ' / decode ' + r.decode_queue + '; tracks ' + r.tracked +
    ' requests (' + esc(states) + ')\n';
  const listed = r.listed || [];
  listed.slice(0, 8).forEach((q, i) => {
    const last = i + 1 === Math.min(8, listed.length) && r.tracked <= 8;
    t += '│  ' + (last ? '└─ ' : '├─ ') + 'request ' + q.id + ': ' + esc(q.state) +
      (q.prefill_worker ? ' on ' + esc(q.prefill_worker) : '') + (q.decode_worker ? ' → ' + esc(q.decode_worker) : '') + '\n';
  });
  if (r.tracked > 8) t += '│  └─ … ' + (r.tracked - 8) + ' more (table below)\n';
  t += '├─ ' + s.live_connections + ' connection actors, ' + s.live_requests + ' request actors, ' + s.in_flight +
    ' requests in flight over the network\n';
  t += '├─ KV links: ' + r.kv_links + ' (' + r.retiring_kv_links + ' retiring)\n';
  const gauge = (n, tier) => { for (const g of ((s.metrics || {}).gauges || {})[n] || []) if (!tier || g.labels.tier === tier) return g.value; return null; };
  const mib = (b) => ((b || 0) / 1048576).toFixed(1) + ' MiB';
  if (gauge('tandem_kv_store_bytes', 'memory') !== null)
    t += '├─ KV store: ' + mib(gauge('tandem_kv_store_bytes', 'memory')) + ' in memory, ' + mib(gauge('tandem_kv_store_bytes', 'disk')) +
      ' on disk' + (degraded.kv_store ? ', DEGRADED' : '') + '; prefix-cache hit ratio ' +
      (100 * (gauge('tandem_prefix_cache_hit_ratio') || 0)).toFixed(1) + '%\n';
  const nodes = s.nodes || [];
  if (nodes.length > 0) {
    t += '├─ cluster: ' + nodes.length + ' worker processes joined\n';
    nodes.forEach((n, i) => {
      t += '│  ' + (i + 1 < nodes.length ? '├─ ' : '└─ ') + esc(n.role) + ' node ' + n.id + ' (' + esc(n.name) + ', ' +
        esc(n.device) + '): workers ' + esc((n.workers || []).join(',')) + ', heartbeat ' + n.since_heartbeat_ms + ' ms ago\n';
    });
  }
  const kinds = Object.keys(pools);
  kinds.forEach((k, i) => {
    const lastPool = i + 1 === kinds.length;
    t += (lastPool ? '└─ ' : '├─ ') + k + ' pool supervisor: restarts ' + (restarts[k] || 0) + (degraded[k] ? ', DEGRADED' : '') + '\n';
    pools[k].forEach((w, j) => {
      const used = w.kv_free_blocks < 0 ? '?' : (w.kv_total_blocks - w.kv_free_blocks);
      t += (lastPool ? '   ' : '│  ') + (j + 1 < pools[k].length ? '├─ ' : '└─ ') + esc(w.name) +
        ': ' + (w.active > 0 ? 'busy' : 'idle') + ', ' + w.active + ' sequences' + (w.max_batch > 0 ? ' (batch ≤ ' + w.max_batch + ')' : '') + ', KV ' + used +
        '/' + w.kv_total_blocks + ' blocks\n';
    });
  });
  tree.textContent = ''; tree.innerHTML = '<pre>' + t + '</pre>';
  rows.innerHTML = s.workers.map(w => {
    const used = w.kv_free_blocks < 0 ? '?' : (w.kv_total_blocks - w.kv_free_blocks);
    const pct = w.kv_free_blocks < 0 ? 0 : 100 * used / Math.max(1, w.kv_total_blocks);
    return '<tr class="worker"><td>' + esc(w.name) + '</td><td>' + w.active + ' / ' + (w.max_batch || '–') + '</td><td><span class="bar" style="width:' + pct.toFixed(0) +
      'px"></span> ' + used + ' / ' + w.kv_total_blocks + '</td><td>' + w.reserved_blocks + '</td><td>' + w.steps + '</td></tr>';
  }).join('');
  rrows.innerHTML = listed.map(q => '<tr class="request"><td>' + q.id + '</td><td>' + esc(q.state) + '</td><td>' +
    esc(q.prefill_worker || '–') + '</td><td>' + esc(q.decode_worker || '–') + '</td><td>' + q.prompt_tokens + '</td><td>' +
    q.max_tokens + '</td></tr>').join('');
  const m = [];
  const walk = (o, p) => { for (const [k, v] of Object.entries(o || {})) { if (v !== null && typeof v === 'object') walk(v, p + k + '.'); else m.push([p + k, v]); } };
  walk(s.metrics, '');
  mrows.innerHTML = m.filter(([k]) => /queue|restart|reject|requests_total|kv_link|degraded|prefix|kv_store|direct|cluster/.test(k)).slice(0, 80)
    .map(([k, v]) => '<tr><td>' + esc(k) + '</td><td>' + esc(v) + '</td></tr>').join('');
  document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
}
const src = new EventSource('/dashboard/feed');
src.onmessage = (e) => show(JSON.parse(e.data));
</script></body></html>
)HTML";
}

}  // namespace tandem::server
