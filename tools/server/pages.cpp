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
<span id="keybox">API key <input id="key" type="password" autocomplete="off"><button id="savekey" type="button">)HTML"
         R"HTML(Use</button></span>
<span id="status">connecting…</span></header>
<div id="log"></div>
<details><summary>settings</summary><label>system prompt<br><textarea id="system" placeholder="(none)">)HTML"
         R"HTML(</textarea></label></details>
<form id="f"><textarea id="prompt" placeholder="Say something (Enter sends, Shift+Enter for a new line)">Once )HTML"
         R"HTML(upon a time</textarea>
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
function apiKey() { return new URLSearchParams(location.search).get('api_key') || )HTML"
         R"HTML(localStorage.getItem('tandem_api_key') || ''; }
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
  ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws' + (key ? )HTML"
         R"HTML('?api_key=' + encodeURIComponent(key) : ''));
  ws.onopen = () => { retry = 500; setStatus('connected'); };
  ws.onclose = () => {
    for (const id of Object.keys(live)) { showError(live[id], 'error: the connection closed before the answer )HTML"
         R"HTML(ended'); live[id].box.dataset.done = '1'; finish(id); }
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
document.getElementById('savekey').onclick = () => { localStorage.setItem('tandem_api_key', keyInput.value); )HTML"
         R"HTML(connect(); };
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
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
 header{padding:10px 16px;background:#1d2330;color:#fff;display:flex;gap:12px;flex-wrap:wrap;align-items:center} )HTML"
         R"HTML(header a{color:#9cc3ff}
 header input{font:inherit;padding:2px 6px;width:140px}
 main{padding:12px;max-width:1100px;margin:auto}
 .tree{font-family:ui-monospace,monospace;background:#fff;padding:12px;border-radius:8px;box-shadow:0 1px 2px )HTML"
         R"HTML(#0002;overflow-x:auto}
 .tree pre{margin:0}
 .plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:10px;margin-top:12px}
 .plot{background:#fff;border-radius:8px;padding:8px;box-shadow:0 1px 2px #0002;min-width:0}
 .plot h3{margin:0 0 4px;font-size:13px;font-weight:600} .plot canvas{width:100%;height:120px;display:block}
 .legend{font-size:11px;color:#556}
 .wrap{overflow-x:auto}
 table{border-collapse:collapse;width:100%;background:#fff;margin-top:12px;box-shadow:0 1px 2px #0002}
 th,td{padding:5px 8px;border-bottom:1px solid #e3e6ea;text-align:right} th:first-child,td:first-child{text-align:left}
 .bar{display:inline-block;height:8px;background:#2f6fde;vertical-align:middle}
 button.kill{font:inherit;font-size:12px;padding:2px 8px;border:0;border-radius:4px;background:#b00020;)HTML"
         R"HTML(color:#fff;cursor:pointer}
 button.kill:disabled{opacity:.35;cursor:default}
 #timeline{background:#fff;border-radius:8px;box-shadow:0 1px 2px #0002;margin-top:12px;padding:8px 12px;)HTML"
         R"HTML(max-height:260px;overflow:auto;font-size:13px}
 #timeline div{border-bottom:1px solid #eef0f3;padding:3px 0} .lv-warning{color:#8a5a00} .lv-error{color:#b00020;)HTML"
         R"HTML(font-weight:600}
 #updated{margin-left:auto;font-size:12px;color:#ccd}
</style></head>
<body><header><b>tandem</b><span>dashboard</span><a href="/">chat</a>
<label>admin key <input id="adminkey" type="password" autocomplete="off"></label>
<button class="kill" id="killrouter" data-target="router" disabled>kill router</button>
<button class="kill" id="killstore" data-target="kv_store" disabled>kill KV store</button>
<span id="updated">waiting for the feed…</span></header>
<main><div class="tree" id="tree"></div>
<div class="plots" id="plots"></div>
<h3>events</h3><div id="timeline"><i>no supervision events yet</i></div>
<div class="wrap"><table><thead><tr><th>worker</th><th>sequences / max batch</th><th>KV used / total</th><th>)HTML"
         R"HTML(reserved</th><th>step: sequences, prompt tokens</th><th>steps</th><th></th></tr></thead><tbody )HTML"
         R"HTML(id="workers"></tbody></table></div>
<div class="wrap"><table><thead><tr><th>request actor</th><th>state</th><th>prefill worker</th><th>decode )HTML"
         R"HTML(worker</th><th>prompt tokens</th><th>max tokens</th></tr></thead><tbody id="requests"></tbody>)HTML"
         R"HTML(</table></div>
<div class="wrap"><table><thead><tr><th>metric</th><th>labels</th><th>value</th><th>rate /s</th></tr></thead>)HTML"
         R"HTML(<tbody id="metrics"></tbody></table></div></main>
<script>
const tree = document.getElementById('tree'), rows = document.getElementById('workers'), mrows = )HTML"
         R"HTML(document.getElementById('metrics');
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
      (q.prefill_worker ? ' on ' + esc(q.prefill_worker) : '') + (q.decode_worker ? ' → ' + esc(q.decode_worker) )HTML"
         R"HTML(: '') + '\n';
  });
  if (r.tracked > 8) t += '│  └─ … ' + (r.tracked - 8) + ' more (table below)\n';
  t += '├─ ' + s.live_connections + ' connection actors, ' + s.live_requests + ' request actors, ' + s.in_flight +
    ' requests in flight over the network\n';
  t += '├─ KV links: ' + r.kv_links + ' (' + r.retiring_kv_links + ' retiring)\n';
  const gauge = (n, tier) => { for (const g of ((s.metrics || {}).gauges || {})[n] || []) if (!tier || )HTML"
         R"HTML(g.labels.tier === tier) return g.value; return null; };
  const mib = (b) => ((b || 0) / 1048576).toFixed(1) + ' MiB';
  if (gauge('tandem_kv_store_bytes', 'memory') !== null)
    t += '├─ KV store: ' + mib(gauge('tandem_kv_store_bytes', 'memory')) + ' in memory, ' + )HTML"
         R"HTML(mib(gauge('tandem_kv_store_bytes', 'disk')) +
      ' on disk' + (degraded.kv_store ? ', DEGRADED' : '') + '; prefix-cache hit ratio ' +
      (100 * (gauge('tandem_prefix_cache_hit_ratio') || 0)).toFixed(1) + '%\n';
  const nodes = s.nodes || [];
  if (nodes.length > 0) {
    t += '├─ cluster: ' + nodes.length + ' worker processes joined\n';
    nodes.forEach((n, i) => {
      t += '│  ' + (i + 1 < nodes.length ? '├─ ' : '└─ ') + esc(n.role) + ' node ' + n.id + ' (' + esc(n.name) + ', ' +
        esc(n.device) + '): workers ' + esc((n.workers || []).join(',')) + ', heartbeat ' + n.since_heartbeat_ms )HTML"
         R"HTML(+ ' ms ago\n';
    });
  }
  const kinds = Object.keys(pools);
  kinds.forEach((k, i) => {
    const lastPool = i + 1 === kinds.length;
    t += (lastPool ? '└─ ' : '├─ ') + k + ' pool supervisor: restarts ' + (restarts[k] || 0) + (degraded[k] ? ', )HTML"
         R"HTML(DEGRADED' : '') + '\n';
    pools[k].forEach((w, j) => {
      const used = w.kv_free_blocks < 0 ? '?' : (w.kv_total_blocks - w.kv_free_blocks);
      t += (lastPool ? '   ' : '│  ') + (j + 1 < pools[k].length ? '├─ ' : '└─ ') + esc(w.name) +
        ': ' + (w.busy ? 'in a step of ' + w.step_sequences + ' sequences, ' + w.step_prefill_tokens + ' prompt )HTML"
         R"HTML(tokens' : 'idle') + ', ' + w.active + ' sequences held' + (w.max_batch > 0 ? ' (batch ≤ ' + )HTML"
         R"HTML(w.max_batch + ')' : '') + ', KV ' + used +
        '/' + w.kv_total_blocks + ' blocks\n';
    });
  });
  tree.textContent = ''; tree.innerHTML = '<pre>' + t + '</pre>';
  rows.innerHTML = s.workers.map(w => {
    const used = w.kv_free_blocks < 0 ? '?' : (w.kv_total_blocks - w.kv_free_blocks);
    const pct = w.kv_free_blocks < 0 ? 0 : 100 * used / Math.max(1, w.kv_total_blocks);
    return '<tr class="worker"><td>' + esc(w.name) + '</td><td>' + w.active + ' / ' + (w.max_batch || '–') + )HTML"
         R"HTML('</td><td><span class="bar" style="width:' + pct.toFixed(0) +
      'px"></span> ' + used + ' / ' + w.kv_total_blocks + '</td><td>' + w.reserved_blocks + '</td><td class="step">' +
      (w.busy ? '' : 'last: ') + w.step_sequences + ', ' + w.step_prefill_tokens + '</td><td>' + w.steps +
      '</td><td><button class="kill" data-target="' + esc(w.name) + '"' + (keyInput.value ? '' : ' disabled') + )HTML"
         R"HTML('>kill</button></td></tr>';
  }).join('');
  // A KV link per (prefill, decode) pair: kill buttons of their own (kv_link-pP-dD).
  if (s.mode === 'disaggregated' || s.mode === 'auto') {
    const ps = s.workers.filter(w => w.name.startsWith('prefill-')), ds = s.workers.filter(w => )HTML"
         R"HTML(w.name.startsWith('decode-'));
    for (const p of ps) for (const d of ds) {
      const name = 'kv_link-p' + p.name.split('-')[1] + '-d' + d.name.split('-')[1];
      rows.innerHTML += '<tr class="link"><td>' + name + '</td><td></td><td></td><td></td><td></td><td><button )HTML"
         R"HTML(class="kill" data-target="' +
        name + '"' + (keyInput.value ? '' : ' disabled') + '>kill</button></td></tr>';
    }
  }
  rrows.innerHTML = listed.map(q => '<tr class="request"><td>' + q.id + '</td><td>' + esc(q.state) + '</td><td>' +
    esc(q.prefill_worker || '–') + '</td><td>' + esc(q.decode_worker || '–') + '</td><td>' + q.prompt_tokens + )HTML"
         R"HTML('</td><td>' +
    q.max_tokens + '</td></tr>').join('');
  metricsTable(s.metrics || {});
  timeline(s.events || []);
  plot(s);
  document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
}
// ---- the metrics as a table: name, labels, value, rate (from the previous feed)
let lastValues = {}, lastAt = 0;
function metricsTable(ms) {
  const now = performance.now(), rows = [], values = {};
  const add = (name, labels, v) => {
    const key = name + JSON.stringify(labels);
    values[key] = v;
    const rate = lastAt && key in lastValues && name.endsWith('_total') ? (v - lastValues[key]) / ((now - )HTML"
         R"HTML(lastAt) / 1000) : null;
    const l = Object.entries(labels || {}).map(([k, x]) => k + '=' + x).join(', ');
    rows.push('<tr><td>' + esc(name) + '</td><td>' + esc(l) + '</td><td>' + esc(+v.toFixed(3)) + '</td><td>' + )HTML"
         R"HTML((rate === null ? '' : rate.toFixed(2)) + '</td></tr>');
  };
  for (const kind of ['counters', 'gauges'])
    for (const [name, series] of Object.entries(ms[kind] || {})) for (const x of series) add(name, x.labels, x.value);
  for (const [name, series] of Object.entries(ms.histograms || {}))
    for (const x of series) { add(name + '_count', x.labels, x.count); if (x.p50 !== null) add(name + ' p50', )HTML"
         R"HTML(x.labels, x.p50); if (x.p90 !== null) add(name + ' p90', x.labels, x.p90); }
  mrows.innerHTML = rows.join('');
  lastValues = values; lastAt = now;
}
// ---- the supervision events (kills, restarts, migrations, degraded pools), newest first
let seen = 0;
const events = [];
function timeline(list) {
  for (const e of list) if (e.seq > seen) { events.unshift(e); seen = e.seq; }
  events.splice(200);
  if (!events.length) return;
  document.getElementById('timeline').innerHTML = events.map(e => {
    const f = Object.entries(e).filter(([k]) => !['event', 'seq', 'unix_ms', 'level'].includes(k)).map(([k, v]) )HTML"
         R"HTML(=> k + '=' + v).join(' ');
    const lv = e.event === 'pool_degraded' ? 'error' : /kill|restart|down|lost|migrate$/.test(e.event) ? )HTML"
         R"HTML('warning' : 'info';
    return '<div class="ev lv-' + lv + '" data-event="' + esc(e.event) + '">' + new )HTML"
         R"HTML(Date(e.unix_ms).toLocaleTimeString() + ' <b>' + esc(e.event) + '</b> ' + esc(f) + '</div>';
  }).join('');
}
// ---- plots over the last five minutes, drawn on canvases
const series = {};  // plot -> line -> [values]
let prevCounters = null, prevAt = 0;
const plotDefs = [
  ['queues', 'queue length'], ['running', 'requests by state'], ['tokens', 'tokens / s'], ['ttft', 'TTFT ms (p50,)HTML"
         R"HTML( p90)'],
  ['tpot', 'TPOT ms (p50, p90)'], ['kv', 'KV blocks used per worker'], ['kvbytes', 'KV bytes moved / s'], )HTML"
         R"HTML(['prefix', 'prefix-cache hit ratio']];
const plotsDiv = document.getElementById('plots');
plotsDiv.innerHTML = plotDefs.map(([id, title]) => '<div class="plot"><h3>' + title + '</h3><canvas id="plot-' + )HTML"
         R"HTML(id + '" data-points="0"></canvas><div class="legend" id="legend-' + id + '"></div></div>').join('');
function push(plotId, line, v) {
  const p = series[plotId] = series[plotId] || {};
  const a = p[line] = p[line] || [];
  a.push(Number.isFinite(v) ? v : 0);
  if (a.length > 300) a.shift();
}
function counter(ms, name) { let t = 0; for (const x of ((ms.counters || {})[name] || [])) t += x.value; return t; }
function hist(ms, name, q) { const x = ((ms.histograms || {})[name] || [])[0]; return x && x[q] !== null ? x[q] )HTML"
         R"HTML(* 1000 : 0; }
function plot(s) {
  const ms = s.metrics || {}, r = s.router || {requests: {}};
  push('queues', 'prefill', r.prefill_queue); push('queues', 'decode', r.decode_queue);
  for (const [state, n] of Object.entries(r.requests || {})) if (['queued', 'prefilling', )HTML"
         R"HTML('decoding'].includes(state)) push('running', state, n);
  const now = performance.now(), c = {prompt: counter(ms, 'tandem_prompt_tokens_total'), output: counter(ms, )HTML"
         R"HTML('tandem_output_tokens_total'),
    kv: counter(ms, 'tandem_kv_bytes_total'), cached: counter(ms, 'tandem_prompt_tokens_cached_total')};
  if (prevCounters) {
    const dt = (now - prevAt) / 1000;
    push('tokens', 'prompt', (c.prompt - prevCounters.prompt) / dt); push('tokens', 'output', (c.output - )HTML"
         R"HTML(prevCounters.output) / dt);
    push('kvbytes', 'KV link', (c.kv - prevCounters.kv) / dt);
    const dp = c.prompt - prevCounters.prompt;
    push('prefix', 'cached / prompt', dp > 0 ? (c.cached - prevCounters.cached) / dp : 0);
  }
  prevCounters = c; prevAt = now;
  push('ttft', 'p50', hist(ms, 'tandem_request_ttft_seconds', 'p50')); push('ttft', 'p90', hist(ms, )HTML"
         R"HTML('tandem_request_ttft_seconds', 'p90'));
  push('tpot', 'p50', hist(ms, 'tandem_request_tpot_seconds', 'p50')); push('tpot', 'p90', hist(ms, )HTML"
         R"HTML('tandem_request_tpot_seconds', 'p90'));
  for (const w of s.workers) if (w.kv_free_blocks >= 0) push('kv', w.name, w.kv_total_blocks - w.kv_free_blocks);
  const colors = ['#2f6fde', '#e07b00', '#18a058', '#b00020', '#7b3fe4', '#0097a7'];
  for (const [id] of plotDefs) {
    const cv = document.getElementById('plot-' + id), lines = series[id] || {};
    const w = cv.width = cv.clientWidth * devicePixelRatio, h = cv.height = 120 * devicePixelRatio, g = )HTML"
         R"HTML(cv.getContext('2d');
    let max = 0, n = 0;
    for (const a of Object.values(lines)) { for (const v of a) max = Math.max(max, v); n = Math.max(n, a.length); }
    cv.dataset.points = n;
    g.clearRect(0, 0, w, h); g.fillStyle = '#889'; g.font = (10 * devicePixelRatio) + 'px sans-serif';
    g.fillText(max ? +max.toPrecision(3) : '0', 2, 10 * devicePixelRatio);
    Object.entries(lines).forEach(([name, a], i) => {
      g.strokeStyle = colors[i % colors.length]; g.lineWidth = 1.5 * devicePixelRatio; g.beginPath();
      a.forEach((v, k) => { const x = w * (k + 300 - a.length) / 299, y = h - 2 - (max ? v / max : 0) * (h - 14 )HTML"
         R"HTML(* devicePixelRatio);
        k ? g.lineTo(x, y) : g.moveTo(x, y); });
      g.stroke();
    });
    document.getElementById('legend-' + id).innerHTML = Object.keys(lines).map((name, i) =>
      '<span style="color:' + colors[i % colors.length] + '">■</span> ' + esc(name) + ' ' + )HTML"
         R"HTML((+(lines[name].at(-1) || 0).toPrecision(3))).join(' &nbsp; ');
  }
}
// ---- kill buttons (the fault-injection tester's workflow): enabled once the admin key is in
const keyInput = document.getElementById('adminkey');
keyInput.value = localStorage.getItem('tandem_admin_key') || '';
function armButtons() { for (const b of document.querySelectorAll('button.kill')) b.disabled = !keyInput.value; }
keyInput.oninput = () => { localStorage.setItem('tandem_admin_key', keyInput.value); armButtons(); };
document.addEventListener('click', async (e) => {
  const b = e.target.closest('button.kill');
  if (!b || b.disabled) return;
  b.disabled = true;
  const r = await fetch('/admin/kill', {method: 'POST', headers: {Authorization: 'Bearer ' + keyInput.value}, )HTML"
         R"HTML(body: JSON.stringify({kind: b.dataset.target})});
  const j = await r.json().catch(() => ({}));
  b.title = r.ok ? 'killed ' + j.name : 'refused: ' + ((j.error || {}).message || r.status);
  setTimeout(armButtons, 500);
});
armButtons();
const src = new EventSource('/dashboard/feed');
src.onmessage = (e) => show(JSON.parse(e.data));
</script></body></html>
)HTML";
}

}  // namespace tandem::server
