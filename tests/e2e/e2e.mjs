// End to end with independent clients: `tandem serve` on a free port, driven by the npm
// `openai` package (streamed chat completion, non-streamed completion), `ws` (the WebSocket
// protocol: two interleaved requests, cancel, a disconnect that frees KV blocks), Debian's
// `promtool check metrics` on /metrics, and headless Chromium through `playwright-core`
// (the chat page streams an answer; the dashboard shows the workers).
// Usage: node e2e.mjs TANDEM_BINARY MODEL.gguf
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { unlinkSync } from 'node:fs';
import OpenAI from 'openai';
import WebSocket from 'ws';
import { chromium } from 'playwright-core';

const [tandem, modelPath] = process.argv.slice(2);
if (!tandem || !modelPath) {
  console.error('usage: node e2e.mjs TANDEM_BINARY MODEL.gguf');
  process.exit(2);
}

function startServer(args = null) {
  return new Promise((resolve, reject) => {
    // (Restart intensity raised: the kill checks below must not leave a pool degraded for the
    // checks after them; degrading is tested in test_pipeline_kills. The default mode, auto, has its
    // decode worker compute prompts of up to --token-budget tokens itself: 64 here, so that
    // longer ones take the prefill worker and the KV link and the checks see both paths.)
    const p = spawn(tandem, args ?? ['serve', '--model', modelPath, '--model-name', 'tiny', '--port', '0', '--admin-key', 'adm',
                                     '--max-worker-restarts', '100', '--token-budget', '64'],
                    { stdio: ['ignore', 'inherit', 'pipe'] });
    let log = '';
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), 60000);
    p.stderr.on('data', (d) => {
      log += d.toString();
      process.stderr.write(d);
      const m = log.match(/on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc: p, port: Number(m[1]) }); }
    });
    p.on('exit', (code) => reject(new Error('server exited early with ' + code + ':\n' + log)));
  });
}

const { proc, port } = await startServer();
const base = `http://127.0.0.1:${port}`;
let failures = 0;
async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

async function waitReady() {
  for (let i = 0; i < 300; i++) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r && r.status === 200) return;
    await new Promise((res) => setTimeout(res, 100));
  }
  throw new Error('/health never became ready');
}

async function adminState() {
  const r = await fetch(`${base}/admin/state`, { headers: { Authorization: 'Bearer adm' } });
  assert.equal(r.status, 200);
  return r.json();
}

async function expectClean() {
  let s;
  // Up to ~15 s: on a loaded 2-core machine the workers' restarts after kills take seconds.
  for (let i = 0; i < 600; i++) {
    s = await adminState();
    const clean = s.live_requests === 0 && s.workers.every((w) => w.kv_free_blocks === w.kv_total_blocks && w.reserved_blocks === 0);
    if (clean) return;
    await new Promise((res) => setTimeout(res, 25));
  }
  throw new Error('KV blocks or requests still held: ' + JSON.stringify(s));
}

await waitReady();
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused' });

let greedyText = '';
await check('openai: non-streamed completion', async () => {
  const r = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12);
  greedyText = r.choices[0].text;
});

await check('openai: streamed chat completion with usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 10, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '', chunks = 0, usage = null, finish = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (c.choices.length) {
      chunks++;
      text += c.choices[0].delta.content ?? '';
      finish = c.choices[0].finish_reason ?? finish;
    }
  }
  assert.ok(chunks >= 2, 'several chunks');
  assert.ok(['length', 'stop'].includes(finish));
  assert.ok(usage && usage.completion_tokens >= 1);
  // The same request without streaming gives the same text.
  const whole = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 10, temperature: 0 });
  assert.equal(whole.choices[0].message.content, text);
});

await check('openai: errors are APIErrors with the right status', async () => {
  await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }), (e) => e.status === 400);
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 0 }), (e) => e.status === 400);
});

await check('openai: sampling controls change the output; unimplemented fields are 400s naming them', async () => {
  const base = { model: 'tiny', prompt: 'Once upon a time', max_tokens: 12, temperature: 0, ignore_eos: true };
  const plain = await client.completions.create(base);
  // +100 on one token: every output token is it, so the text is that token's text 12 times.
  const one = await client.completions.create({ ...base, max_tokens: 1, logit_bias: { '100': 100 } });
  const forced = await client.completions.create({ ...base, logit_bias: { '100': 100 } });
  assert.equal(forced.choices[0].text, one.choices[0].text.repeat(12));
  // -100 bans: every token of the (300-token) vocabulary but 100 banned gives the same text.
  const bans = {};
  for (let t = 0; t < 300; t++) if (t !== 100) bans[String(t)] = -100;
  const onlyOne = await client.completions.create({ ...base, logit_bias: bans });
  assert.equal(onlyOne.choices[0].text, forced.choices[0].text);
  assert.notEqual(forced.choices[0].text, plain.choices[0].text);
  // A frequency penalty changes a repetitive greedy answer.
  const pen = await client.completions.create({ ...base, frequency_penalty: 2 });
  assert.notEqual(pen.choices[0].text, plain.choices[0].text);
  // Log-probabilities in both forms: legacy lists on completions, content entries on chat.
  const lp = await client.completions.create({ ...base, logprobs: 2 });
  assert.equal(lp.choices[0].logprobs.token_logprobs.length, lp.usage.completion_tokens);
  assert.ok(lp.choices[0].logprobs.token_logprobs.every((v) => v <= 0));
  const clp = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2 });
  assert.equal(clp.choices[0].logprobs.content.length, clp.usage.completion_tokens);
  assert.equal(clp.choices[0].logprobs.content[0].top_logprobs.length, 2);
  const echoed = await client.completions.create({ ...base, echo: true });
  assert.equal(echoed.choices[0].text, base.prompt + plain.choices[0].text);
  // n = 3: three choices (choice 0 the n = 1 answer), usage counting the prompt once; streamed
  // chat with n = 2: every chunk names its choice.
  const single = await client.completions.create({ ...base, temperature: 1.5, seed: 9 });
  const n3 = await client.completions.create({ ...base, temperature: 1.5, seed: 9, n: 3 });
  assert.deepEqual(n3.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(n3.choices[0].text, single.choices[0].text);
  assert.equal(n3.usage.prompt_tokens, single.usage.prompt_tokens);
  assert.equal(n3.usage.completion_tokens, 36);
  const texts = {};
  const s2 = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 6, temperature: 1.5, seed: 4, n: 2, stream: true, ignore_eos: true });
  for await (const c of s2) for (const ch of c.choices) texts[ch.index] = (texts[ch.index] ?? '') + (ch.delta.content ?? '');
  assert.deepEqual(Object.keys(texts), ['0', '1']);
  const best = await client.completions.create({ ...base, temperature: 1.5, seed: 9, n: 1, best_of: 3 });
  assert.equal(best.choices.length, 1);
  assert.ok(n3.choices.some((c) => c.text === best.choices[0].text), 'the best of the same three');
  for (const [field, value] of [['logprobs', 21], ['suffix', 'x'], ['best_of', 17], ['n', 17]]) {
    await assert.rejects(client.completions.create({ ...base, [field]: value }),
      (e) => e.status === 400 && e.param === field, field);
  }
});

// Structured outputs on a random-weight model: whatever it would say, the grammar shapes it. The
// schema bounds every string, number and list, so each answer must end by itself (finish
// "stop") and validate. Half chat (OpenAI's way), half completions (llama-server's and vLLM's).
await check('openai: json_schema answers parse and validate for 20 seeds, streamed and not', async () => {
  const schema = {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 12 },
      age: { type: 'integer' },
      mood: { enum: ['happy', 'sad', 'calm'] },
      tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
      pet: { type: 'object', properties: { kind: { enum: ['cat', 'dog'] }, legs: { type: 'integer' } },
             required: ['kind', 'legs'], additionalProperties: false },
      note: { anyOf: [{ type: 'null' }, { type: 'boolean' }] },
    },
    required: ['name', 'age', 'mood', 'pet'],
    additionalProperties: false,
  };
  const valid = (v) => {
    const keys = Object.keys(v);
    assert.ok(keys.every((k) => k in schema.properties), 'no extra keys: ' + keys);
    // Properties come in the schema's order.
    const order = Object.keys(schema.properties).filter((k) => k in v);
    assert.deepEqual(keys, order);
    assert.equal(typeof v.name, 'string');
    assert.ok([...v.name].length <= 12);
    assert.ok(Number.isInteger(v.age));
    assert.ok(schema.properties.mood.enum.includes(v.mood));
    if ('tags' in v) {
      assert.ok(Array.isArray(v.tags) && v.tags.length <= 3);
      assert.ok(v.tags.every((t) => typeof t === 'string' && [...t].length <= 6));
    }
    assert.deepEqual(Object.keys(v.pet), ['kind', 'legs']);
    assert.ok(['cat', 'dog'].includes(v.pet.kind) && Number.isInteger(v.pet.legs));
    if ('note' in v) assert.ok(v.note === null || typeof v.note === 'boolean');
  };
  const response_format = { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } };
  // The grammar allows some whitespace between JSON tokens; a random model takes plenty of it,
  // and this one's context is 256 tokens. Its whitespace-only tokens (found by forcing each of
  // the 300 with logit_bias) are banned, so that the answers fit.
  const whitespace = {};
  for (let t0 = 0; t0 < 300; t0 += 50) {
    await Promise.all(Array.from({ length: 50 }, (_, i) => t0 + i).map(async (t) => {
      const r = await client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 1, temperature: 0,
        ignore_eos: true, logit_bias: { [String(t)]: 100 } });
      if (/^\s+$/.test(r.choices[0].text)) whitespace[String(t)] = -100;
    }));
  }
  assert.ok(Object.keys(whitespace).length >= 3, 'space, tab and newline tokens found');
  const runs = [], lengths = [];
  for (let seed = 0; seed < 20; seed++) {
    const stream = seed % 2 === 1;
    const chat = seed % 4 < 2;
    const req = { model: 'tiny', temperature: 1.0, seed, response_format, stream, logit_bias: whitespace,
                  ...(chat ? {} : { max_tokens: 230 }) };
    runs.push((async () => {
      let text = '', finish = null;
      if (chat) {
        const r = await client.chat.completions.create({ ...req, messages: [{ role: 'user', content: 'Describe someone' }] });
        if (stream) {
          for await (const c of r) if (c.choices.length) { text += c.choices[0].delta.content ?? ''; finish = c.choices[0].finish_reason ?? finish; }
        } else {
          text = r.choices[0].message.content;
          finish = r.choices[0].finish_reason;
        }
      } else {
        const r = await client.completions.create({ ...req, prompt: 'Once upon a time' });
        if (stream) {
          for await (const c of r) if (c.choices.length) { text += c.choices[0].text; finish = c.choices[0].finish_reason ?? finish; }
        } else {
          text = r.choices[0].text;
          finish = r.choices[0].finish_reason;
        }
      }
      assert.equal(finish, 'stop', `seed ${seed}: ${text}`);
      let v;
      assert.doesNotThrow(() => { v = JSON.parse(text); }, `seed ${seed}: ${text}`);
      valid(v);
      lengths.push(text.length);
      return text;
    })());
  }
  const texts = await Promise.all(runs);
  assert.ok(new Set(texts).size >= 4, 'the seeds give different answers: ' + texts.join('\n'));
  console.log('  json_schema answers, characters:', lengths.join(' '));
  // json_object: any JSON object; llama-server's `grammar` and vLLM's `guided_choice`.
  const obj = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 200, temperature: 0.7, seed: 3, logit_bias: whitespace, response_format: { type: 'json_object' } });
  if (obj.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(obj.choices[0].message.content), 'object');
  else assert.ok(obj.choices[0].message.content.trimStart().startsWith('{'));
  const yes = await client.completions.create({ model: 'tiny', prompt: 'Answer:', max_tokens: 20, temperature: 1, seed: 1,
    grammar: 'root ::= ("yes" | "no") "!"' });
  assert.ok(['yes!', 'no!'].includes(yes.choices[0].text), yes.choices[0].text);
  assert.equal(yes.choices[0].finish_reason, 'stop');
  const pick = await client.completions.create({ model: 'tiny', prompt: 'Pick:', max_tokens: 20, temperature: 1, seed: 2,
    guided_choice: ['red', 'green', 'blue'] });
  assert.ok(['red', 'green', 'blue'].includes(pick.choices[0].text), pick.choices[0].text);
  // What cannot be honoured is a 400 naming the parameter (and the keyword, or the grammar's line).
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a+$' } } } }),
  (e) => e.status === 400 && e.param === 'response_format' && /pattern/.test(e.message));
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', grammar: 'root ::= nothing' }),
    (e) => e.status === 400 && e.param === 'grammar' && /line 1/.test(e.message));
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', grammar: 'root ::= "a"',
    response_format: { type: 'json_object' } }), (e) => e.status === 400 && /both constrain/.test(e.message));
  await expectClean();
});

await check('ws: two interleaved requests, equal to HTTP', async () => {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
  await new Promise((res, rej) => { ws.on('open', res); ws.on('error', rej); });
  const text = { a: '', b: '' }, order = [];
  const done = new Promise((resolve, reject) => {
    let n = 0;
    ws.on('message', (m) => {
      const f = JSON.parse(m.toString());
      if (f.type === 'error') return reject(new Error(JSON.stringify(f)));
      if (f.type === 'token') { text[f.id] += f.text; order.push(f.id); }
      if (f.type === 'done' && ++n === 2) resolve();
    });
  });
  ws.send(JSON.stringify({ type: 'generate', id: 'a', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 }));
  ws.send(JSON.stringify({ type: 'generate', id: 'b', prompt: 'The little dog', max_tokens: 12, temperature: 0, ignore_eos: true }));
  await done;
  assert.equal(text.a, greedyText, 'WebSocket and HTTP give the same greedy text');
  assert.ok(order.includes('a') && order.includes('b'));
  ws.close();
});

await check('ws: cancel, then a disconnect frees KV blocks', async () => {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
  await new Promise((res, rej) => { ws.on('open', res); ws.on('error', rej); });
  const frames = [];
  const waitFor = (pred) => new Promise((resolve) => {
    const tick = () => { const f = frames.find(pred); if (f) resolve(f); else setTimeout(tick, 5); };
    tick();
  });
  ws.on('message', (m) => frames.push(JSON.parse(m.toString())));
  // The cancel goes out right behind the request: the tiny model makes 200 tokens in a few ms,
  // so waiting for a first token first let the answer finish before the cancel arrived.
  ws.send(JSON.stringify({ type: 'generate', id: 'c', prompt: 'Once', max_tokens: 200, ignore_eos: true }));
  ws.send(JSON.stringify({ type: 'cancel', id: 'c' }));
  const d = await waitFor((f) => f.type === 'done' && f.id === 'c');
  assert.equal(d.finish_reason, 'cancelled');
  ws.send(JSON.stringify({ type: 'generate', id: 'd', prompt: 'Once', max_tokens: 200, ignore_eos: true }));
  await waitFor((f) => f.type === 'token' && f.id === 'd');
  ws.terminate();  // no close handshake: a vanished client
  await expectClean();
});

await check('same seed: tandem generate = HTTP = WebSocket', async () => {
  const P = 'The little dog', n = 12;
  const gen = JSON.parse(execFileSync(tandem, ['generate', '--model', modelPath, '--prompt', P, '-n', String(n),
    '--temperature', '0.8', '--top-k', '20', '--top-p', '0.9', '--seed', '7', '--json'], { encoding: 'utf8' }));
  const http = await client.completions.create({ model: 'tiny', prompt: P, max_tokens: n, temperature: 0.8,
    top_p: 0.9, seed: 7, top_k: 20 });
  assert.equal(http.choices[0].text, gen.text);
  const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
  await new Promise((res, rej) => { ws.on('open', res); ws.on('error', rej); });
  let text = '';
  await new Promise((resolve, reject) => {
    ws.on('message', (m) => {
      const f = JSON.parse(m.toString());
      if (f.type === 'error') reject(new Error(JSON.stringify(f)));
      if (f.type === 'token') text += f.text;
      if (f.type === 'done') resolve();
    });
    ws.send(JSON.stringify({ type: 'generate', id: 1, prompt: P, max_tokens: n, temperature: 0.8, top_k: 20, top_p: 0.9, seed: 7 }));
  });
  ws.close();
  assert.equal(text, gen.text);
});

await check('promtool check metrics', async () => {
  const text = await (await fetch(`${base}/metrics`)).text();
  assert.match(text, /tandem_requests_total/);
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  if (r.error) throw new Error('promtool not found (Debian package prometheus): ' + r.error.message);
  assert.equal(r.status, 0, 'promtool: ' + r.stdout + r.stderr);
});

await check('chromium: chat page: Enter sends, Stop cancels, errors in red, system prompt, a key prompt, reconnect', async () => {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
  const keyed = await startServer(['serve', '--model', modelPath, '--port', '0', '--api-key', 'sekret']);
  try {
    const page = await browser.newPage({ viewport: { width: 390, height: 800 } });
    const sent = [];
    await page.exposeFunction('noteFrame', (f) => sent.push(JSON.parse(f)));
    await page.addInitScript(() => { const s = WebSocket.prototype.send; WebSocket.prototype.send = function (d) { window.noteFrame(d); return s.call(this, d); }; });
    await page.goto(`${base}/`);
    await page.waitForFunction(() => document.getElementById('status').textContent === 'connected');
    // A system prompt leads the messages; Enter sends (Shift+Enter would add a line).
    await page.click('summary');
    await page.fill('#system', 'You are terse.');
    await page.fill('#prompt', 'Hello');
    await page.press('#prompt', 'Enter');
    await page.waitForSelector('.answer[data-done="1"]', { timeout: 30000 });
    assert.deepEqual(sent[0].messages.map((m) => m.role), ['system', 'user']);
    assert.equal(sent[0].messages[0].content, 'You are terse.');
    // Stop cancels the answer in flight (a worker's next step stalls 3 s: it is in flight).
    const armed = await fetch(`${base}/admin/fault`, { method: 'POST', headers: { Authorization: 'Bearer adm' },
                                                       body: JSON.stringify({ fault: 'stall', count: 1, stall_ms: 3000 }) });
    assert.equal(armed.status, 200);
    await page.fill('#max', '200');
    await page.fill('#prompt', 'Tell me a long story');
    await page.press('#prompt', 'Enter');
    await page.waitForTimeout(300);
    assert.equal(await page.$eval('#stop', (b) => b.disabled), false, 'Stop is enabled while an answer runs');
    await page.click('#stop');
    await page.waitForFunction(() => document.querySelectorAll('.answer[data-done="1"]').length === 2, null, { timeout: 30000 });
    assert.ok(sent.some((f) => f.type === 'cancel' && f.id === sent[1].id), 'a cancel frame was sent');
    assert.match(await page.textContent('.answer:nth-of-type(4) .meta'), /cancelled/);
    // (Whatever step met the stall has ended before the checks after this one run.)
    const after = await fetch(`${base}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: 'x', max_tokens: 2 }) });
    assert.equal(after.status, 200);
    // A refused request shows the server's message, in red.
    await page.fill('#max', '16');
    await page.fill('#temp', '7');
    await page.fill('#prompt', 'Too hot');
    await page.press('#prompt', 'Enter');
    await page.waitForSelector('.answer .error', { timeout: 30000 });
    const err = await page.textContent('.answer .error');
    assert.match(err, /temperature/);
    assert.equal(await page.$eval('.answer .error', (e) => getComputedStyle(e).color), 'rgb(176, 0, 32)');
    // The socket drops: the page connects again by itself.
    await page.evaluate(() => ws.close());
    await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('disconnected'), null, { timeout: 5000 });
    await page.waitForFunction(() => document.getElementById('status').textContent === 'connected', null, { timeout: 15000 });
    // Usable at 390 px: nothing wider than the viewport.
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= 390), 'no horizontal scroll at 390 px');
    // A server with --api-key: the page asks for the key, then connects with it.
    const kpage = await browser.newPage();
    await kpage.goto(`http://127.0.0.1:${keyed.port}/`);
    await kpage.waitForSelector('#keybox', { state: 'visible', timeout: 10000 });
    assert.match(await kpage.textContent('#status'), /wants an API key/);
    await kpage.fill('#key', 'sekret');
    await kpage.click('#savekey');
    await kpage.waitForFunction(() => document.getElementById('status').textContent === 'connected', null, { timeout: 10000 });
    await kpage.fill('#prompt', 'Once upon a time');
    await kpage.fill('#max', '8');
    await kpage.press('#prompt', 'Enter');
    await kpage.waitForSelector('.answer[data-done="1"]', { timeout: 30000 });
    assert.equal(await kpage.$$eval('.answer .error', (e) => e.length), 0);
  } finally {
    await browser.close();
    keyed.proc.kill('SIGTERM');
  }
});

await check('chromium: chat page streams an answer; dashboard shows the workers', async () => {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage();
    await page.goto(`${base}/`);
    await page.waitForFunction(() => document.getElementById('status').textContent === 'connected');
    await page.fill('#prompt', 'Once upon a time');
    await page.fill('#max', '16');
    await page.click('#send');
    await page.waitForSelector('.answer[data-done="1"]', { timeout: 30000 });
    const answer = await page.textContent('.answer .text');
    assert.ok(answer.length > 0, 'streamed text shown');
    const meta = await page.textContent('.answer .meta');
    assert.match(meta, /TTFT [\d.]+ ms · TPOT [\d.]+ ms/);
    // A second turn carries the conversation (messages, rendered by the chat template).
    const sent = [];
    await page.exposeFunction('noteFrame', (f) => sent.push(JSON.parse(f)));
    await page.evaluate(() => { const s = WebSocket.prototype.send; WebSocket.prototype.send = function (d) { window.noteFrame(d); return s.call(this, d); }; });
    await page.fill('#prompt', 'And then?');
    await page.click('#send');
    await page.waitForFunction(() => document.querySelectorAll('.answer[data-done="1"]').length === 2, null, { timeout: 30000 });
    assert.equal(sent.length, 1);
    assert.deepEqual(sent[0].messages.map((m) => m.role), ['user', 'assistant', 'user']);
    assert.equal(sent[0].messages[2].content, 'And then?');
    await page.goto(`${base}/dashboard`);
    await page.waitForSelector('tr.worker', { timeout: 10000 });
    const names = await page.$$eval('tr.worker td:first-child', (tds) => tds.map((t) => t.textContent));
    const tree = await page.textContent('#tree');
    assert.match(tree, /router: queues prefill \d+ \/ decode \d+; tracks \d+ requests/);
    assert.match(tree, /\d+ connection actors, \d+ request actors/);
    assert.match(tree, /prefill pool supervisor: restarts \d+/);
    assert.match(tree, /decode-0: (busy|idle), \d+ sequences/);
    assert.match(tree, /KV store: [\d.]+ MiB in memory, [\d.]+ MiB on disk; prefix-cache hit ratio [\d.]+%/);
    assert.ok(names.some((n) => n.startsWith('prefill')) && names.some((n) => n.startsWith('decode')), names.join(','));
  } finally {
    await browser.close();
  }
});

await check('chromium: dashboard plots move under load, a kill from the page shows in the timeline, usable at 390 px', async () => {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
  let loading = false, load = Promise.resolve();  // (stopped in finally: a failed check must not leave load behind)
  try {
    const page = await browser.newPage({ viewport: { width: 390, height: 900 } });
    await page.goto(`${base}/dashboard`);
    await page.waitForSelector('tr.worker', { timeout: 10000 });
    // Load while the feed ticks: the plots take a point a second and the tokens/s line rises.
    loading = true;
    load = (async () => {
      while (loading) await fetch(`${base}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 32 }) });
    })();
    const longLoad = (async () => {  // past the decode worker's 64 tokens: the prefill worker's
      while (loading)
        await fetch(`${base}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: 'Once upon a time '.repeat(30), max_tokens: 8 }) });
    })();
    load = Promise.all([load, longLoad]);
    await page.waitForFunction(() => +document.getElementById('plot-tokens').dataset.points >= 3, null, { timeout: 20000 });
    // A busy worker's KV use is known (what it was when its step began), never '?'.
    const kvShown = [];
    for (let i = 0; i < 4; i++) { kvShown.push(await page.textContent('#workers')); await page.waitForTimeout(300); }
    assert.ok(kvShown.every((t) => !t.includes('?')), kvShown.join(' | '));
    // Each worker's current (or last) step: its sequences and the prompt tokens in it; the
    // prefill worker's last step computed a prompt.
    const steps = await page.$$eval('tr.worker', (trs) => trs.map((t) => t.cells[0].textContent + ': ' + t.querySelector('td.step').textContent));
    assert.ok(steps.some((t) => /^prefill-\d+: (last: )?[1-9]\d*, [1-9]\d*$/.test(t)), steps.join(' | '));
    assert.ok(steps.some((t) => /^decode-\d+: (last: )?[1-9]\d*, \d+$/.test(t)), steps.join(' | '));
    loading = false;
    await load;
    assert.match(await page.textContent('#legend-tokens'), /output [1-9]/, 'tokens/s plotted above 0');
    // The metrics as a table with rates.
    const metricRows = await page.$$eval('#metrics tr', (trs) => trs.map((t) => t.textContent));
    assert.ok(metricRows.some((t) => t.startsWith('tandem_requests_total')), metricRows.slice(0, 5).join(' | '));
    // Kill buttons wait for the admin key; a kill from the page appears in the timeline.
    assert.equal(await page.$eval('tr.worker button.kill', (b) => b.disabled), true);
    await page.fill('#adminkey', 'adm');
    await page.waitForFunction(() => !document.querySelector('tr.worker button.kill').disabled);
    await page.click('tr.worker button.kill[data-target="decode-0"]');
    await page.waitForSelector('#timeline .ev[data-event="kill"]', { timeout: 10000 });
    await page.waitForSelector('#timeline .ev[data-event="restart"]', { timeout: 10000 });
    assert.match(await page.textContent('#timeline .ev[data-event="kill"]'), /actor=decode-0/);
    // ... and a KV link's.
    await page.waitForFunction(() => { const b = document.querySelector('tr.link button.kill'); return b && !b.disabled; }, null, { timeout: 10000 });
    await page.click('tr.link button.kill[data-target="kv_link-p0-d0"]');
    await page.waitForFunction(() => [...document.querySelectorAll('#timeline .ev[data-event="kill"]')].some((e) => /actor=kv_link-p0-d0/.test(e.textContent)),
                               null, { timeout: 10000 });
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= 390), 'no horizontal scroll at 390 px');
  } finally {
    loading = false;
    await load.catch(() => {});
    await browser.close();
  }
});

// Chaos through the server: the independent `ws` client streams 16 greedy requests while
// workers and KV links are killed through /admin/kill; every stream must run 0, 1, 2, ...
// with one final event and the same text as without faults; then nothing is held.
await check('ws chaos: kills through /admin/kill lose nothing, outputs exact', async () => {
  const prompts = Array.from({ length: 16 }, (_, i) => `Once upon a time ${'there was a dog '.repeat(1 + (i % 5))}${i}`);
  async function runAll(killing) {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
    await new Promise((res, rej) => { ws.on('open', res); ws.on('error', rej); });
    const streams = new Map(prompts.map((_, i) => [`k${i}`, { next: 0, text: '', finals: 0, end: null }]));
    let ended = 0;
    const done = new Promise((res, rej) => {
      const timer = setTimeout(() => rej(new Error(`only ${ended} of ${prompts.length} streams ended`)), 120000);
      ws.on('message', (m) => {
        const f = JSON.parse(m.toString());
        const s = streams.get(f.id);
        if (!s) return;
        assert.equal(s.finals, 0, `${f.id}: an event after its final one`);
        if (f.type === 'token') {
          assert.equal(f.index, s.next, `${f.id}: token index repeated or skipped`);
          s.next++;
          s.text += f.text;
        } else if (f.type === 'done' || f.type === 'error') {
          s.finals++;
          s.end = f.type === 'done' ? f.finish_reason : `error ${f.code}: ${f.message}`;
          if (++ended === prompts.length) { clearTimeout(timer); res(); }
        }
      });
    });
    prompts.forEach((prompt, i) =>
      ws.send(JSON.stringify({ type: 'generate', id: `k${i}`, prompt, max_tokens: 40, temperature: 0, ignore_eos: true })));
    const kills = [];
    if (killing) {
      for (const kind of ['decode', 'prefill', 'kv_link', 'decode', 'kv_link', 'prefill']) {
        await new Promise((res) => setTimeout(res, 40));
        const r = await fetch(`${base}/admin/kill`, {
          method: 'POST', headers: { Authorization: 'Bearer adm', 'Content-Type': 'application/json' },
          body: JSON.stringify({ kind }) });
        if (r.status === 200) kills.push((await r.json()).name);
        else assert.equal(r.status, 404, `kill ${kind}: ${r.status}`);  // none alive that moment
      }
    }
    await done;
    ws.close();
    return { streams, kills };
  }
  const clean = await runAll(false);
  await waitReady();
  const chaos = await runAll(true);
  assert.ok(chaos.kills.length >= 3, 'kills landed: ' + chaos.kills.join(','));
  for (const [id, s] of chaos.streams) {
    assert.equal(s.end, 'length', `${id} ended with ${s.end}`);
    assert.equal(s.text, clean.streams.get(id).text, `${id}: output differs from the fault-free run`);
  }
  await expectClean();
  const metrics = await (await fetch(`${base}/metrics`)).text();
  assert.match(metrics, /tandem_restarts_total\{kind="decode"\} [1-9]/);
});

await check('tandem chaos: a soak with random kills loses nothing', async () => {
  await waitReady();
  const out = await new Promise((res, rej) => {
    const p = spawn(tandem, ['chaos', '--url', base, '--admin-key', 'adm', '--kill', 'random', '--every', '500ms',
                             '--for', '3s', '--concurrency', '8', '--json'], { stdio: ['ignore', 'pipe', 'inherit'] });
    let text = '';
    p.stdout.on('data', (d) => { text += d.toString(); });
    p.on('exit', (code) => res({ code, text }));
    p.on('error', rej);
  });
  const r = JSON.parse(out.text);
  assert.equal(out.code, 0, out.text);
  assert.equal(r.ok, true);
  assert.equal(r.lost, 0);
  assert.equal(r.duplicated_tokens + r.skipped_tokens + r.leaked_blocks, 0);
  assert.ok(r.kills >= 3 && r.requests_sent > 0, out.text);
});

// `tandem bench serve` against this server, through both clients: every figure present, and
// consistent with what the server counted.
await check('tandem bench serve: figures present and consistent (openai and ws)', async () => {
  await waitReady();
  for (const api of ['openai', 'ws']) {
    const out = await new Promise((res, rej) => {
      const p = spawn(tandem, ['bench', 'serve', '--url', base, '--api', api, '--requests', '12', '--rate', '40',
                               '--trace', 'mixed', '--slo-ttft', '2000', '--slo-tpot', '200', '--json',
                               // other prompts for the second run: the same ones would come from the
                               // prefix cache (and go straight to decode), moving no KV over a link
                               '--seed', api === 'openai' ? '1' : '2'],
                      { stdio: ['ignore', 'pipe', 'inherit'] });
      let text = '';
      p.stdout.on('data', (d) => { text += d.toString(); });
      p.on('exit', (code) => res({ code, text }));
      p.on('error', rej);
    });
    assert.equal(out.code, 0, out.text);
    const r = JSON.parse(out.text);
    assert.equal(r.requests_sent, 12, api);
    assert.equal(r.completed, 12, `${api}: ${JSON.stringify(r.errors)}`);
    assert.equal(r.failed, 0);
    // What the client counted is what the server counted over the same interval.
    assert.equal(r.output_tokens, r.server.output_tokens, `${api}: output tokens`);
    assert.equal(r.prompt_tokens, r.server.prompt_tokens, `${api}: prompt tokens`);
    for (const k of ['ttft_s', 'tpot_s', 'itl_s', 'e2e_s']) {
      const s = r[k];
      assert.ok(s.count > 0 && s.mean > 0, `${api} ${k}: ${JSON.stringify(s)}`);
      assert.ok(s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.max, `${api} ${k} percentiles in order`);
    }
    assert.equal(r.ttft_s.count, 12);
    assert.ok(r.e2e_s.p50 >= r.ttft_s.p50);
    assert.ok(r.request_throughput > 0 && r.output_tokens_per_s > 0 && r.prompt_tokens_per_s > 0);
    assert.ok(r.goodput <= r.request_throughput + 1e-9 && r.slo_attainment >= 0 && r.slo_attainment <= 1);
    // The default (auto) computes a prompt that fits in its decode worker's slack there (no KV
    // link; on this small model that can be all of them); every other one crosses the link.
    assert.ok(r.server.kv_transfers + r.server.local_prefills >= 12 && (r.server.kv_transfers > 0) === (r.server.kv_bytes_moved > 0),
              `${api}: KV moved ${JSON.stringify(r.server)}`);
    assert.ok(r.server.prompt_tokens_computed > 0 && r.server.prompt_tokens_computed <= r.server.prompt_tokens,
              `${api}: prompt tokens computed ${r.server.prompt_tokens_computed}`);
    assert.equal(r.server.weight_duplication_factor, 1);
    assert.ok(r.server.weight_bytes_per_worker > 0);
    for (const part of ['cpu', 'gpu'])  // a measurement, or said to be missing: never made up
      assert.ok(typeof r.energy[part] === 'string' ? /not available/.test(r.energy[part]) : r.energy[part].joules >= 0, part);
  }
});

// A real trained model (stories260K): a frequency penalty lowers the repeats of a greedy story.
await check('openai on stories260K: frequency_penalty lowers repeats', async () => {
  const srv = await startServer(['serve', '--model', '../data/stories260K.gguf', '--model-name', 'stories', '--port', '0']);
  try {
    const c = new OpenAI({ baseURL: `http://127.0.0.1:${srv.port}/v1`, apiKey: 'unused' });
    const repeats = (r) => {
      const counts = {};
      for (const t of r.choices[0].logprobs.tokens) counts[t] = (counts[t] ?? 0) + 1;
      return Object.values(counts).reduce((a, b) => a + b - 1, 0);  // tokens that came before
    };
    const req = { model: 'stories', prompt: 'Once upon a time', max_tokens: 96, temperature: 0, logprobs: 0, ignore_eos: true };
    const plain = await c.completions.create(req);
    const pen = await c.completions.create({ ...req, frequency_penalty: 1.0 });
    assert.ok(repeats(pen) < repeats(plain), `repeats ${repeats(pen)} with the penalty, ${repeats(plain)} without`);
    const pres = await c.completions.create({ ...req, presence_penalty: 1.5 });
    assert.ok(repeats(pres) < repeats(plain), `repeats ${repeats(pres)} with presence_penalty, ${repeats(plain)} without`);
  } finally {
    srv.proc.kill('SIGTERM');
  }
});

// Tools through the official client, on a synthetic model with room for a tools prompt
// (context 1024) and Qwen 3's template: forced calls come back as tool_calls, streamed too,
// and a second turn with the tool's answer renders.
await check('openai: tools and tool_choice (Qwen 3 template)', async () => {
  const small = `${process.env.TMPDIR ?? '/tmp'}/tandem-e2e-small-${process.pid}.gguf`;
  execFileSync(tandem, ['model', 'synth', '--preset', 'small', '--dtype', 'q8_0', '--out', small], { stdio: 'ignore' });
  const srv = await startServer(['serve', '--model', small, '--model-name', 'small', '--port', '0',
                                 '--chat-template', '../data/templates/qwen3.jinja']);
  try {
    const c = new OpenAI({ baseURL: `http://127.0.0.1:${srv.port}/v1`, apiKey: 'unused' });
    const tools = [
      { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['c', 'f'] } },
                      required: ['city', 'unit'] } } },
      { type: 'function', function: { name: 'add', parameters: { type: 'object',
        properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] } } },
    ];
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    for (let seed = 0; seed < 3; seed++) {
      const r = await c.chat.completions.create({ model: 'small', messages, tools, tool_choice: 'required', seed, temperature: 1 });
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      const call = r.choices[0].message.tool_calls[0];
      assert.ok(['get_weather', 'add'].includes(call.function.name));
      const args = JSON.parse(call.function.arguments);
      if (call.function.name === 'add') assert.ok(Number.isInteger(args.a) && Number.isInteger(args.b));
      else assert.ok(typeof args.city === 'string' && ['c', 'f'].includes(args.unit));
    }
    const named = await c.chat.completions.create({ model: 'small', messages, tools, seed: 1,
      tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    const call = named.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    // Streamed: the client sees the call as tool_calls deltas.
    const stream = await c.chat.completions.create({ model: 'small', messages, tools, tool_choice: 'required', seed: 2, stream: true });
    let name = '', args = '', finish = null;
    for await (const ch of stream) {
      const d = ch.choices[0]?.delta;
      for (const t of d?.tool_calls ?? []) { name += t.function?.name ?? ''; args += t.function?.arguments ?? ''; }
      finish = ch.choices[0]?.finish_reason ?? finish;
    }
    assert.ok(['get_weather', 'add'].includes(name), name);
    assert.equal(typeof JSON.parse(args), 'object');
    assert.equal(finish, 'tool_calls');
    // The second turn: the call and the tool's answer in the history.
    const second = await c.chat.completions.create({ model: 'small', tools, max_tokens: 4, messages: [...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: call.id, type: 'function', function: call.function }] },
      { role: 'tool', tool_call_id: call.id, content: 'sunny, 21 C' }] });
    assert.equal(second.choices[0].message.role, 'assistant');
    await assert.rejects(c.chat.completions.create({ model: 'small', messages, tools,
      tool_choice: { type: 'function', function: { name: 'rm' } } }), (e) => e.status === 400 && e.param === 'tool_choice');
  } finally {
    srv.proc.kill('SIGTERM');
    unlinkSync(small);
  }
});

// Graceful shutdown: SIGTERM → exit 0.
const exited = new Promise((res) => proc.on('exit', (code) => res(code)));
proc.kill('SIGTERM');
const code = await exited;
await check('SIGTERM exits 0', async () => assert.equal(code, 0));

console.log(failures ? `${failures} e2e check(s) failed` : 'all e2e checks passed');
process.exit(failures ? 1 : 0);
