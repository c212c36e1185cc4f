// A bounded soak against a live `m3serve serve` on the bundled model: valid requests, malformed
// JSON, malformed HTTP on raw sockets, aborts mid-stream and slow clients, mixed by a seeded
// generator (M3_SOAK_SEED replays a run; M3_SOAK_SECONDS sets its length, 45 s by default).
// The process must never die, every response must be well formed (an OpenAI error object for
// every error, never a 500), and the running-request and KV gauges must return to their baseline.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { MODEL, startServer, stopServer, metricValue, waitFor } from './helpers.mjs';

const SECONDS = Number(process.env.M3_SOAK_SECONDS ?? 45);
const SEED = Number(process.env.M3_SOAK_SEED ?? Date.now() % 1000000);
const WORKERS = 6;
const ALLOWED = new Set([200, 400, 404, 405, 413, 429, 431, 501, 503]);

// mulberry32: a small seeded generator, so a failing mix can be replayed.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const deep = (n) => '['.repeat(n) + ']'.repeat(n);
const chat = (extra = {}) => JSON.stringify({
  model: MODEL, messages: [{ role: 'user', content: 'What is 2 + 3?' }], max_tokens: 8, ...extra,
});

// Bodies the server must refuse with a 4xx (and never crash on).
const BAD_BODIES = [
  ['/v1/chat/completions', '{"messages": [{"role": "user", "content": "hi"}'],
  ['/v1/chat/completions', '\xff\xfe\x00garbage'],
  ['/v1/chat/completions', chat({ temperature: 'hot' })],
  ['/v1/chat/completions', '{"messages": 5}'],
  ['/v1/chat/completions', chat({ tools: [{ type: 5 }] })],
  ['/v1/completions', '{"prompt": "hi", "stop_token_ids": [4294967296]}'],
  ['/v1/completions', '{"prompt": [-1]}'],
  ['/v1/completions', '{"prompt": [4294967297], "echo": true}'],
  ['/v1/completions', '{"prompt": "hi", "logit_bias": {"+5": 1}}'],
  ['/v1/completions', '{"prompt": "hi", "temperature": 1e999}'],
  ['/v1/chat/completions', `{"messages": [{"role": "user", "content": ${deep(20000)}}]}`],
  ['/v1/chat/completions', chat({}).slice(0, -1) + `, "tools": [{"type": "function", "function": {"name": "f", "parameters": ${deep(20000)}}}]}`],
  ['/v1/chat/completions', chat({}).slice(0, -1) + `, "chat_template_kwargs": ${deep(20000)}}`],
  ['/v1/chat/completions', chat({}).slice(0, -1) + `, "logit_bias": {"5": ${deep(20000)}}}`],
  ['/tokenize', '{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "x"}'],
  ['/detokenize', '{"tokens": [1, 2], "skip_special_tokens": "x"}'],
];

// Raw bytes that must get a 4xx and then a closed connection.
const BAD_HTTP = [
  'GARBAGE\r\n\r\n',
  'GET /health HTTP/1.1\nHost: x\n\n',
  'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n',
  'GET /health\r\n',
  'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
  'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3x\r\n\r\nabc',
  'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\nabc',
  `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(70 * 1024)}\r\n\r\n`,
];

// Parses every HTTP/1.1 response in `buf`; throws on anything malformed. Returns [{status, body}].
function parseResponses(buf) {
  const out = [];
  let pos = 0;
  while (pos < buf.length) {
    const end = buf.indexOf('\r\n\r\n', pos);
    if (end < 0) throw new Error(`incomplete header: ${JSON.stringify(buf.subarray(pos, pos + 200).toString())}`);
    const head = buf.subarray(pos, end).toString();
    const m = head.match(/^HTTP\/1\.1 (\d{3}) [^\r\n]*/);
    if (!m) throw new Error(`bad status line: ${JSON.stringify(head.slice(0, 100))}`);
    const len = head.match(/\r\ncontent-length: (\d+)/i);
    if (!len) throw new Error(`no Content-Length: ${head}`);
    const bodyEnd = end + 4 + Number(len[1]);
    if (bodyEnd > buf.length) throw new Error('body shorter than Content-Length');
    out.push({ status: Number(m[1]), body: buf.subarray(end + 4, bodyEnd).toString() });
    pos = bodyEnd;
  }
  return out;
}

function expectErrorObject(status, body, what) {
  let j;
  try { j = JSON.parse(body); } catch { throw new Error(`${what}: ${status} with a non-JSON body: ${body.slice(0, 200)}`); }
  const e = j.error;
  if (!e || typeof e.message !== 'string' || typeof e.type !== 'string' || !('param' in e) || !('code' in e)) {
    throw new Error(`${what}: ${status} without an OpenAI error object: ${body.slice(0, 200)}`);
  }
}

// Sends raw bytes (optionally in slow pieces), reads until the server closes or `ms` passes.
function rawExchange(port, pieces, { delayMs = 0, ms = 8000 } = {}) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => { s.destroy(); reject(new Error(`no close within ${ms} ms: ${buf.toString().slice(0, 200)}`)); }, ms);
    s.on('data', (d) => { buf = Buffer.concat([buf, d]); });
    s.on('error', () => {});
    s.on('close', () => { clearTimeout(timer); resolve(buf); });
    s.on('connect', async () => {
      for (const p of pieces) {
        if (s.destroyed) return;
        s.write(p);
        if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
      }
    });
  });
}

test(`soak: ${SECONDS} s of mixed valid, malformed and aborted traffic (seed ${SEED})`, { timeout: (SECONDS + 60) * 1000 }, async () => {
  const srv = await startServer(['--max-running-requests', '8', '--max-queued-requests', '64']);
  const port = Number(new URL(srv.url).port);
  const counts = {};
  const statuses = {};
  const count = (k) => { counts[k] = (counts[k] ?? 0) + 1; };
  const seen = (s) => {
    statuses[s] = (statuses[s] ?? 0) + 1;
    if (!ALLOWED.has(s)) throw new Error(`unexpected status ${s}`);
  };
  const post = async (path, body, signal) => {
    const r = await fetch(`${srv.url}${path}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body, signal,
    });
    seen(r.status);
    const text = await r.text();
    if (r.status >= 400) expectErrorObject(r.status, text, `${path} ${body.slice(0, 80)}`);
    return { status: r.status, text };
  };
  try {
    // Baseline after one warm-up request (the prefix cache may keep pages: compare used pages).
    await post('/v1/chat/completions', chat());
    const baseUsed = await metricValue(srv, 'm3serve:kv_pages_used');

    const actions = [
      ['chat', async () => { const r = await post('/v1/chat/completions', chat({ n: 2, logprobs: true, top_logprobs: 2 })); assert.equal(r.status, 200, r.text); }],
      ['completion', async (rand) => { const r = await post('/v1/completions', JSON.stringify({ model: MODEL, prompt: 'The sum is', max_tokens: 1 + Math.floor(rand() * 8), temperature: rand() }), undefined); assert.equal(r.status, 200, r.text); }],
      ['stream', async () => {
        const r = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chat({ stream: true, stream_options: { include_usage: true } }) });
        seen(r.status);
        const text = await r.text();
        assert.ok(text.trimEnd().endsWith('data: [DONE]'), text.slice(-200));
        for (const ev of text.split('\n\n').filter((x) => x.startsWith('data: ') && x !== 'data: [DONE]')) JSON.parse(ev.slice(6));
      }],
      ['small routes', async () => {
        for (const [method, path] of [['GET', '/health'], ['GET', '/v1/models'], ['GET', '/metrics'], ['GET', '/nope'], ['DELETE', '/health']]) {
          const r = await fetch(`${srv.url}${path}`, { method });
          seen(r.status);
          const text = await r.text();
          if (r.status >= 400) expectErrorObject(r.status, text, `${method} ${path}`);
        }
        await post('/tokenize', JSON.stringify({ prompt: 'hello' }));
        await post('/detokenize', JSON.stringify({ tokens: [1, 2, 3] }));
      }],
      ['bad body', async (rand) => {
        const [path, body] = BAD_BODIES[Math.floor(rand() * BAD_BODIES.length)];
        const r = await post(path, body);
        assert.ok(r.status >= 400 && r.status < 500, `${path} ${body.slice(0, 80)} -> ${r.status}`);
      }],
      ['bad http', async (rand) => {
        const raw = BAD_HTTP[Math.floor(rand() * BAD_HTTP.length)];
        const buf = await rawExchange(port, [raw]);
        const rs = parseResponses(buf);
        assert.equal(rs.length, 1, `${JSON.stringify(raw.slice(0, 60))}: ${buf.toString().slice(0, 200)}`);
        seen(rs[0].status);
        assert.ok(rs[0].status >= 400 && rs[0].status < 502, `${JSON.stringify(raw.slice(0, 60))} -> ${rs[0].status}`);
        expectErrorObject(rs[0].status, rs[0].body, JSON.stringify(raw.slice(0, 60)));
      }],
      ['truncated', async () => {
        // A body shorter than its Content-Length, then the client closes: no answer is owed.
        const s = net.connect(port, '127.0.0.1');
        s.on('error', () => {});
        await new Promise((r) => s.on('connect', r));
        s.end('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt"');
        await new Promise((r) => { s.on('close', r); setTimeout(r, 3000); });
        s.destroy();
      }],
      ['abort stream', async (rand) => {
        const ac = new AbortController();
        const r = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chat({ stream: true, max_tokens: 200, ignore_eos: true }), signal: ac.signal });
        seen(r.status);
        const reader = r.body.getReader();
        await reader.read();
        await new Promise((res) => setTimeout(res, rand() * 50));
        ac.abort();
        await reader.read().catch(() => {});
      }],
      ['abort non-stream', async (rand) => {
        const ac = new AbortController();
        const p = fetch(`${srv.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'Count:', max_tokens: 200, ignore_eos: true }), signal: ac.signal });
        setTimeout(() => ac.abort(), 5 + rand() * 40);
        try { const r = await p; seen(r.status); await r.text(); } catch { /* aborted */ }
      }],
      ['slow client', async () => {
        const req = 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n';
        const pieces = req.match(/.{1,6}/gs);
        const buf = await rawExchange(port, pieces, { delayMs: 40 });
        const rs = parseResponses(buf);
        assert.equal(rs.length, 1);
        seen(rs[0].status);
        assert.equal(rs[0].status, 200);
      }],
    ];

    const deadline = Date.now() + SECONDS * 1000;
    const worker = async (w) => {
      const rand = rng(SEED * 31 + w);
      while (Date.now() < deadline) {
        const [name, fn] = actions[Math.floor(rand() * actions.length)];
        count(name);
        try {
          await fn(rand);
        } catch (e) {
          throw new Error(`worker ${w}, action '${name}' (seed ${SEED}): ${e.message}\n${srv.log().slice(-2000)}`);
        }
        assert.equal(srv.proc.exitCode, null, `the server exited:\n${srv.log().slice(-2000)}`);
      }
    };
    await Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)));

    // Everything that ran has ended: nothing running or waiting, the KV pages back.
    const settled = await waitFor(async () => (
      await metricValue(srv, 'm3serve:num_requests_running') === 0 &&
      await metricValue(srv, 'm3serve:num_requests_waiting') === 0 &&
      await metricValue(srv, 'm3serve:kv_pages_used') === baseUsed), 15000, 100);
    assert.ok(settled, `gauges did not return: running ${await metricValue(srv, 'm3serve:num_requests_running')}, ` +
      `waiting ${await metricValue(srv, 'm3serve:num_requests_waiting')}, pages used ` +
      `${await metricValue(srv, 'm3serve:kv_pages_used')} (baseline ${baseUsed})`);
    assert.equal((await fetch(`${srv.url}/health`)).status, 200);
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    console.log(`soak seed ${SEED}: ${total} actions ${JSON.stringify(counts)}; statuses ${JSON.stringify(statuses)}`);
  } finally {
    assert.equal(await stopServer(srv), 0, srv.log().slice(-2000));
  }
});
