// `m3serve router` end to end over three CPU workers on the bundled m3-tiny:
//   - a multi-turn `m3serve bench` through the router: cache_aware's measured prefix-cache hit
//     rate (the workers' usage.cached_tokens) is at least twice round_robin's;
//   - the official `openai` npm client, streaming and not, through the router, and a client
//     leaving mid-stream (the worker stops generating); the admin routes behind the API key;
//   - a dead worker: one retry, then out of the pool; no worker left: 502, then 503;
//   - a worker killed mid-run: no request is lost except those already streaming from it, and
//     those end with an error event naming it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(here, '..', '..');
const bin = process.env.M3SERVE_BIN ?? path.join(repoRoot, 'build', 'bin', 'm3serve');

// Starts `m3serve args...`; resolves once stderr shows `pattern` (its group 1 is the port).
function start(args, pattern, timeoutMs = 60000) {
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'], cwd: repoRoot });
  let log = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const port = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${args[0]} did not start:\n${log}`)), timeoutMs);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(pattern);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${args[0]} exited with ${code}:\n${log}`));
    });
  });
  return port.then((p) => ({
    proc,
    port: p,
    url: `http://127.0.0.1:${p}`,
    log: () => log,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  }));
}

function startWorker() {
  return start(
    ['serve', '--host', '127.0.0.1', '--port', '0', '--device', 'cpu', '--http-threads', '1',
     '--tokenizer-worker-num', '1'],
    /ready: serving '[^']*' on http:\/\/[^:]+:(\d+)/);
}

function startRouter(workers, extra = []) {
  return start(
    ['router', '--host', '127.0.0.1', '--port', '0', '--health-check-interval-secs', '0.5',
     '--worker-urls', ...workers.map((w) => w.url), ...extra],
    /on http:\/\/[^:]+:(\d+)/, 15000);
}

// Runs `m3serve bench` (JSON on stdout); resolves with {code, json, stderr}.
function bench(port, args) {
  return new Promise((resolve) => {
    const proc = spawn(bin, ['bench', '--port', String(port), '--json', '--output-details',
                             '--backend', 'openai-chat', ...args],
                       { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    proc.stdout.on('data', (d) => (out += d.toString()));
    proc.stderr.on('data', (d) => (err += d.toString()));
    proc.on('exit', (code) => {
      let json = null;
      try {
        json = JSON.parse(out);
      } catch {
        // reported by the caller's assertion with stderr
      }
      resolve({ code, json, stderr: err });
    });
  });
}

async function metric(url, name, worker) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const key = worker ? `m3serve_router:${name}{worker="${worker}"} ` : `m3serve_router:${name} `;
  const line = text.split('\n').find((l) => l.startsWith(key));
  return line === undefined ? NaN : Number(line.slice(key.length));
}

// One conversation at a time: round robin then sends a conversation's three turns to three
// different workers. (With as many conversations in flight as workers, round robin can keep
// them in lockstep, one worker each, which is as good as cache_aware; that is luck, not design.)
// Every prompt starts with the chat template's preamble, which every worker caches whatever the
// policy; long turns keep it a small part of the hit rate.
// A worker's own gauge (m3serve:NAME{model_name="..."} VALUE).
async function workerMetric(url, name) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `));
  return line === undefined ? NaN : Number(line.split(' ').pop());
}

// The router's in-flight requests over all workers, through its API key.
async function metricWithKey(url, key) {
  const text = await (await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${key}` } })).text();
  let total = 0;
  for (const l of text.split('\n')) {
    if (l.startsWith('m3serve_router:worker_in_flight{')) total += Number(l.split(' ').pop());
  }
  return total;
}

const multiTurn = ['--dataset', 'multi-turn', '--num-conversations', '6', '--turns', '3',
                   '--random-input-len', '100', '--random-output-len', '8',
                   '--max-concurrency', '1'];

let workers = [];
before(async () => {
  workers = await Promise.all([startWorker(), startWorker(), startWorker()]);
});
after(async () => {
  await Promise.all(workers.map((w) => w.stop()));
});

test('cache_aware keeps conversations on their worker: at least twice the prefix hits of round_robin', async () => {
  const rates = {};
  // A different seed per run: the second run's conversations share nothing with the first's.
  for (const [policy, seed] of [['cache_aware', '11'], ['round_robin', '12']]) {
    // Turn 2 repeats turn 1 and adds as much again, so it matches just under half its text:
    // below the default threshold of 0.5; 0.3 is SGLang's command-line default.
    const router = await startRouter(workers, ['--policy', policy, '--cache-threshold', '0.3']);
    try {
      const r = await bench(router.port, [...multiTurn, '--seed', seed]);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.json.completed, 18, r.stderr);
      assert.equal(r.json.failed, 0);
      assert.equal(r.json.dataset_name, 'multi-turn');
      assert.ok(r.json.total_cached_tokens !== null, 'the workers report cached_tokens');
      rates[policy] = r.json.prefix_hit_rate;
      if (policy === 'cache_aware') {
        // Turns after the first follow the match; the router's own estimate agrees.
        const routed = await metric(router.url, 'cache_routed_total');
        assert.ok(routed >= 12, `${routed} requests followed the match`);  // turns 2 and 3
        let matched = 0;
        for (const w of workers) matched += await metric(router.url, 'worker_prefix_match_rate', w.url);
        assert.ok(matched > 0);
      }
    } finally {
      await router.stop();
    }
  }
  console.log(`prefix hit rate: cache_aware ${rates.cache_aware}, round_robin ${rates.round_robin}`);
  assert.ok(rates.cache_aware > 0.3, `cache_aware hit rate ${rates.cache_aware}`);
  assert.ok(rates.cache_aware >= 2 * rates.round_robin,
            `cache_aware ${rates.cache_aware} vs round_robin ${rates.round_robin}`);
});

test('the openai client streams through the router; admin routes need the API key', async () => {
  const key = 'router-key';
  const router = await startRouter(workers, ['--api-key', key]);
  try {
    const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: key, maxRetries: 0 });
    const models = await client.models.list();
    assert.equal(models.data[0].id, 'm3-tiny');
    const stream = await client.chat.completions.create({
      model: 'm3-tiny', messages: [{ role: 'user', content: 'What is 47 + 35?' }],
      max_tokens: 12, stream: true, stream_options: { include_usage: true },
    });
    let text = '';
    let finish = null;
    let usage = null;
    let chunks = 0;
    for await (const chunk of stream) {
      ++chunks;
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += (c.delta.content ?? '') + (c.delta.reasoning_content ?? '');
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.ok(chunks >= 12, `${chunks} chunks`);
    assert.ok(text.length > 0);
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 12);
    // The same request unstreamed: the greedy output is the same text.
    const whole = await client.chat.completions.create({
      model: 'm3-tiny', messages: [{ role: 'user', content: 'What is 47 + 35?' }], max_tokens: 12,
    });
    const m = whole.choices[0].message;
    assert.equal((m.content ?? '') + (m.reasoning_content ?? ''), text);

    // A client that goes away mid-stream: the router closes its connection to the worker, which
    // stops generating (its running count drops back to 0 long before 3000 tokens).
    const controller = new AbortController();
    const long = await client.chat.completions.create({
      model: 'm3-tiny', messages: [{ role: 'user', content: 'Tell me a long story.' }],
      max_tokens: 3000, ignore_eos: true, stream: true,
    }, { signal: controller.signal });
    let n = 0;
    let running = 0;
    for await (const chunk of long) {
      void chunk;
      if (++n === 4) {
        for (const w of workers) running += await workerMetric(w.url, 'm3serve:num_requests_running');
      }
      if (n === 8) controller.abort();
    }
    assert.equal(running, 1, 'the stream runs on one worker');
    assert.ok(n >= 8 && n < 1000, `chunks: ${n}`);
    let stopped = false;
    for (let i = 0; i < 200 && !stopped; ++i) {
      let total = 0;
      for (const w of workers) total += await workerMetric(w.url, 'm3serve:num_requests_running');
      total += await metricWithKey(router.url, key);
      stopped = total === 0;
      if (!stopped) await new Promise((r) => setTimeout(r, 25));
    }
    assert.ok(stopped, 'the worker kept generating after the client left');

    // A wrong key is refused; /health needs none.
    const bad = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    assert.equal((await fetch(`${router.url}/health`)).status, 200);
    const auth = { authorization: `Bearer ${key}` };
    assert.equal((await fetch(`${router.url}/list_workers`)).status, 401);
    const list = await (await fetch(`${router.url}/list_workers`, { headers: auth })).json();
    assert.deepEqual(list.urls, workers.map((w) => w.url));
    const target = encodeURIComponent(workers[0].url);
    let r = await fetch(`${router.url}/remove_worker?url=${target}`, { method: 'POST', headers: auth });
    assert.equal(r.status, 200);
    r = await fetch(`${router.url}/remove_worker?url=${target}`, { method: 'POST', headers: auth });
    assert.equal(r.status, 404);
    assert.equal((await (await fetch(`${router.url}/list_workers`, { headers: auth })).json()).urls.length, 2);
    r = await fetch(`${router.url}/add_worker?url=${target}`, { method: 'POST' });
    assert.equal(r.status, 401);
    r = await fetch(`${router.url}/add_worker?url=${target}`, { method: 'POST', headers: auth });
    assert.equal(r.status, 200);
    r = await fetch(`${router.url}/add_worker?url=ftp%3A%2F%2Fx`, { method: 'POST', headers: auth });
    assert.equal(r.status, 400);
    assert.match((await r.json()).error.message, /ftp:\/\/x/);
    assert.equal((await (await fetch(`${router.url}/list_workers`, { headers: auth })).json()).urls.length, 3);
  } finally {
    await router.stop();
  }
});

test('a dead worker costs a retry, then leaves the pool; no worker at all is a clear error', async () => {
  const dead = 'http://127.0.0.1:1';  // nothing listens on port 1
  const router = await start(
    ['router', '--host', '127.0.0.1', '--port', '0', '--policy', 'round_robin',
     '--health-check-interval-secs', '60', '--worker-urls', dead, workers[0].url],
    /on http:\/\/[^:]+:(\d+)/, 15000);
  try {
    const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    for (let i = 0; i < 4; ++i) {
      const r = await client.completions.create({ model: 'm3-tiny', prompt: `count ${i}`, max_tokens: 2 });
      assert.equal(r.choices.length, 1);
    }
    assert.equal(await metric(router.url, 'worker_healthy', dead), 0);
    // Round robin sends it one request, retried on the live worker; then it is out of the pool.
    assert.equal(await metric(router.url, 'retries_total'), 1);
    assert.equal(await metric(router.url, 'worker_requests_total', workers[0].url), 4);
    assert.equal(await metric(router.url, 'worker_in_flight', workers[0].url), 0);
  } finally {
    await router.stop();
  }
  const lonely = await start(
    ['router', '--host', '127.0.0.1', '--port', '0', '--worker-urls', dead],
    /on http:\/\/[^:]+:(\d+)/, 15000);
  try {
    const body = JSON.stringify({ model: 'm3-tiny', prompt: 'hi', max_tokens: 2 });
    const headers = { 'content-type': 'application/json' };
    let r = await fetch(`${lonely.url}/v1/completions`, { method: 'POST', body, headers });
    assert.equal(r.status, 502);  // tried, refused
    assert.match((await r.json()).error.message, /127\.0\.0\.1:1/);
    r = await fetch(`${lonely.url}/v1/completions`, { method: 'POST', body, headers });
    assert.equal(r.status, 503);  // out of the pool now
    assert.equal((await r.json()).error.code, 'no_available_workers');
    assert.equal((await fetch(`${lonely.url}/health`)).status, 503);
  } finally {
    await lonely.stop();
  }
});

test('a worker killed mid-run loses only the requests it was streaming', async () => {
  const router = await startRouter(workers);
  const victim = workers[2];
  try {
    const run = bench(router.port, ['--dataset', 'multi-turn', '--num-conversations', '9',
                                    '--turns', '4', '--random-input-len', '32',
                                    '--random-output-len', '48', '--max-concurrency', '6',
                                    '--seed', '21']);
    // Kill the victim once it is generating (tokens streaming out).
    for (let i = 0; i < 400; ++i) {
      if (await workerMetric(victim.url, 'm3serve:num_requests_running') > 0) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    await new Promise((r) => setTimeout(r, 200));
    await victim.stop('SIGKILL');
    const r = await run;
    assert.ok(r.json, r.stderr);
    assert.equal(r.json.completed + r.json.failed, 36);
    const errors = r.json.request_errors.filter((e) => e !== '');
    assert.equal(errors.length, r.json.failed);
    for (const e of errors) {
      assert.match(e, /failed mid-stream/, e);
      assert.ok(e.includes(victim.url), e);
    }
    const retries = await metric(router.url, 'retries_total');
    console.log(`worker killed: ${r.json.failed} streaming request(s) cut, ${retries} retried`);
    assert.ok(r.json.failed <= 6, `${r.json.failed} failed`);
    // The kill hit requests in flight on the victim: cut streams or retried attempts.
    assert.ok(r.json.failed + retries > 0);
    assert.ok(r.json.completed >= 30);
    // The router took the victim out of the pool and its load counter went back to 0.
    assert.equal(await metric(router.url, 'worker_healthy', victim.url), 0);
    assert.equal(await metric(router.url, 'worker_in_flight', victim.url), 0);
  } finally {
    await router.stop();
  }
});
