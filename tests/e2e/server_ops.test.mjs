// Operational behaviour: /v1/completions, stop strings, auth on every route, /metrics, health
// while loading, 413, cancel on disconnect (streaming and not), 1,000 concurrent streams, and
// SIGTERM draining.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { startServer, script, metrics, metricValue, waitFor, serverOnly, viaRouter } from './helpers.mjs';

const M = '{model_name="m3-tiny"';

test('/v1/completions: text, stream, echo, stop strings, token prompts, batches', async () => {
  const srv = await startServer(['--fake-step-ms', '1']);
  try {
    const c = srv.client;
    const r = await c.completions.create({ model: 'm3-tiny', prompt: script('Hello world. STOP more'), max_tokens: 100, stop: ['STOP'] });
    assert.equal(r.choices[0].text, 'Hello world. ');
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.object, 'text_completion');
    const len = await c.completions.create({ model: 'm3-tiny', prompt: script('abcdefghij'), max_tokens: 4 });
    assert.equal(len.choices[0].text, 'abcd');
    assert.equal(len.choices[0].finish_reason, 'length');
    assert.equal(len.usage.completion_tokens, 4);
    let streamed = '';
    let usage = null;
    const s = await c.completions.create({
      model: 'm3-tiny', prompt: script('streamed text STOP', { tps: 3 }), stop: 'STOP', stream: true,
      stream_options: { include_usage: true }, max_tokens: 50,
    });
    for await (const ch of s) {
      for (const choice of ch.choices) streamed += choice.text;
      if (ch.usage) usage = ch.usage;
    }
    assert.equal(streamed, 'streamed text ');
    assert.ok(usage.completion_tokens > 0);
    const echo = await c.completions.create({ model: 'm3-tiny', prompt: 'FAKE_OUTPUT_B64=IQ==', echo: true, max_tokens: 5 });
    assert.equal(echo.choices[0].text, 'FAKE_OUTPUT_B64=IQ==!');
    const ids = await c.completions.create({ model: 'm3-tiny', prompt: [72, 105], max_tokens: 3 });
    assert.equal(ids.usage.prompt_tokens, 2);
    await assert.rejects(c.completions.create({ model: 'm3-tiny', prompt: [1, 99999] }),
      (e) => e.status === 400 && e.param === 'prompt');
    // A batch of prompts: choices indexed prompt * n + i, streamed and not.
    const batch = await c.completions.create({
      model: 'm3-tiny', prompt: [script('one'), script('two')], n: 2, max_tokens: 10,
    });
    assert.deepEqual(batch.choices.map((x) => [x.index, x.text]),
      [[0, 'one'], [1, 'one'], [2, 'two'], [3, 'two']]);
    const texts = {};
    const bs = await c.completions.create({
      model: 'm3-tiny', prompt: [[72, 105], [72]], stream: true, max_tokens: 2,
      stream_options: { include_usage: true },
    });
    let batchUsage = null;
    for await (const ch of bs) {
      for (const choice of ch.choices) texts[choice.index] = (texts[choice.index] ?? '') + choice.text;
      if (ch.usage) batchUsage = ch.usage;
    }
    assert.deepEqual(Object.keys(texts).sort(), ['0', '1']);
    assert.equal(batchUsage.prompt_tokens, 3);
    await assert.rejects(c.completions.create({ model: 'm3-tiny', prompt: ['a', [1]] }),
      (e) => e.status === 400 && e.param === 'prompt[1]');
  } finally {
    await srv.stop();
  }
});

test('--api-key covers every route but /health, /metrics included', async () => {
  const srv = await startServer([], { apiKey: 'sk-e2e' });
  try {
    const routes = [
      ['GET', '/v1/models'], ['GET', '/v1/models/m3-tiny'], ['GET', '/metrics'],
      ['GET', '/health_generate'], ['POST', '/v1/chat/completions'], ['POST', '/v1/completions'],
      ['POST', '/tokenize'], ['POST', '/detokenize'], ['GET', '/no/such/route'],
    ];
    for (const [method, path] of routes) {
      for (const auth of [undefined, 'Bearer wrong', 'sk-e2e']) {
        const headers = auth ? { authorization: auth } : {};
        const r = await fetch(srv.url + path, { method, headers, body: method === 'POST' ? '{}' : undefined });
        assert.equal(r.status, 401, `${method} ${path} with ${auth}`);
        const body = await r.json();
        assert.equal(body.error.code, 'invalid_api_key');
      }
    }
    assert.equal((await fetch(`${srv.url}/health`)).status, 200);
    const ok = await fetch(`${srv.url}/metrics`, { headers: { authorization: 'Bearer sk-e2e' } });
    assert.equal(ok.status, 200);
    const chat = await srv.client.chat.completions.create({ model: 'm3-tiny', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(chat.choices[0].message.content, 'Hello from the fake backend.');
  } finally {
    await srv.stop();
  }
});

test('/health is 503 until loaded; /health_generate; /metrics names', { skip: serverOnly }, async () => {
  // The server listens at once and loads the model in the background (1.5 s here).
  const srv = await startServer(['--fake-load-ms', '1500']);
  try {
    assert.equal((await fetch(`${srv.url}/health`)).status, 503);
    const early = await fetch(`${srv.url}/v1/chat/completions`, {
      method: 'POST', body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }),
    });
    assert.equal(early.status, 503);
    assert.match((await early.json()).error.message, /loading/);
    const tok = await fetch(`${srv.url}/tokenize`, { method: 'POST', body: '{"prompt":"x"}' });
    assert.equal(tok.status, 503);
    assert.ok(await waitFor(async () => (await fetch(`${srv.url}/health`)).status === 200, 5000));
    assert.equal((await fetch(`${srv.url}/health_generate`)).status, 200);
    await srv.client.chat.completions.create({ model: 'm3-tiny', messages: [{ role: 'user', content: script('abc', { tps: 1 }) }] });
    const text = await metrics(srv.serverUrl);
    for (const name of ['m3serve:num_requests_running', 'm3serve:num_requests_waiting',
      'm3serve:kv_pages_used', 'm3serve:kv_pages_cached', 'm3serve:kv_pages_total',
      'm3serve:prefix_cache_hit_tokens_total']) {
      assert.ok(Number.isFinite(metricValue(text, name + M)), name);
    }
    assert.match(text, /# TYPE m3serve:time_to_first_token_seconds histogram/);
    assert.match(text, /# TYPE m3serve:inter_token_latency_seconds histogram/);
    assert.ok(metricValue(text, `m3serve:time_to_first_token_seconds_count${M}`) >= 1);
    assert.ok(metricValue(text, `m3serve:inter_token_latency_seconds_count${M}`) >= 2);
    assert.ok(metricValue(text, `m3serve:kv_pages_total${M}`) > 0);
  } finally {
    await srv.stop();
  }
});

test('oversized bodies get 413', async () => {
  const srv = await startServer(['--max-request-body-bytes', '10000']);
  try {
    const r = await fetch(`${srv.url}/v1/chat/completions`, {
      method: 'POST',
      body: JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(20000) }] }),
    });
    assert.equal(r.status, 413);
    assert.equal((await r.json()).error.code, 'request_too_large');
  } finally {
    await srv.stop();
  }
});

test('a client that disconnects has its request cancelled (streaming and not)', async () => {
  const srv = await startServer([]);
  try {
    const aborted = async () => metricValue(await metrics(srv.serverUrl), `m3serve:request_success_total${M},finished_reason="abort"}`);
    // Streaming, through the openai client with an AbortController.
    const ctrl = new AbortController();
    const stream = await srv.client.chat.completions.create({
      model: 'm3-tiny', stream: true, messages: [{ role: 'user', content: script('', { infinite: true, stepMs: 5 }) }],
    }, { signal: ctrl.signal });
    let n = 0;
    try {
      for await (const _ of stream) if (++n === 5) ctrl.abort();
    } catch (e) {
      assert.match(e.name, /Abort/);  // the client may end the iteration or throw on abort
    }
    // A chunk already buffered when abort() ran may still be yielded: 5 or a few more.
    assert.ok(n >= 5 && n < 50, `chunks: ${n}`);
    assert.ok(await waitFor(async () => (await aborted()) === 1), 'streaming request cancelled');
    // Not streaming: a raw socket that goes away while the response is being produced.
    const body = JSON.stringify({ messages: [{ role: 'user', content: script('', { infinite: true, stepMs: 5 }) }] });
    const sock = net.connect(srv.port, '127.0.0.1');
    await new Promise((r) => sock.on('connect', r));
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    assert.ok(await waitFor(async () => metricValue(await metrics(srv.serverUrl), `m3serve:num_requests_running${M}`) === 1));
    sock.destroy();
    assert.ok(await waitFor(async () => (await aborted()) === 2), 'non-streaming request cancelled');
    assert.ok(await waitFor(async () => metricValue(await metrics(srv.serverUrl), `m3serve:num_requests_running${M}`) === 0));
  } finally {
    await srv.stop();
  }
});

test('1,000 concurrent streaming connections', async () => {
  const srv = await startServer(['--fake-max-running', '2000', '--http-threads', '4']);
  try {
    const N = 1000;
    const body = JSON.stringify({
      messages: [{ role: 'user', content: script('0123456789'.repeat(5), { stepMs: 40 }) }], stream: true,
    });
    const t0 = Date.now();
    let peak = 0;
    // The gauge is read on a connection of its own (not fetch's pool, where 1,000 streams queue it)
    // in one sequential loop, so a slow read on a loaded machine cannot miss the whole run.
    const readOpen = () => new Promise((resolve) => {
      const req = http.get(`${srv.serverUrl}/metrics`, { agent: false }, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c) => { text += c; });
        res.on('end', () => resolve(metricValue(text, 'm3serve:http_connections_open' + M)));
        res.on('error', () => resolve(NaN));
      });
      req.on('error', () => resolve(NaN));
    });
    let polling = true;
    const pollLoop = (async () => {
      while (polling) {
        const v = await readOpen();
        if (Number.isFinite(v)) peak = Math.max(peak, v);
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    const results = await Promise.all(Array.from({ length: N }, async () => {
      const r = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', body });
      const text = await r.text();
      return { status: r.status, ok: text.trimEnd().endsWith('data: [DONE]'), text };
    }));
    polling = false;
    await pollLoop;
    const elapsed = (Date.now() - t0) / 1000;
    assert.equal(results.filter((r) => r.status === 200 && r.ok).length, N);
    for (const r of results.slice(0, 5)) {
      const content = r.text.split('\n').filter((l) => l.startsWith('data: {'))
        .map((l) => JSON.parse(l.slice(6))).map((c) => c.choices?.[0]?.delta?.content ?? '').join('');
      assert.equal(content, '0123456789'.repeat(5));
    }
    // 51 steps of 40 ms each: about 2 s if the requests really ran together (2,000 s serially).
    assert.ok(elapsed < 30, `took ${elapsed}s`);
    // Directly, the server holds them all at once. Through the router the server sees the
    // streams as fast as the router opens its upstream connections, so only their outcome counts.
    if (!viaRouter) assert.ok(peak >= 500, `peak open connections ${peak}`);
  } finally {
    await srv.stop();
  }
});

test('SIGTERM drains in-flight requests, refuses new ones, then exits 0', async () => {
  const srv = await startServer([]);
  const inflight = srv.client.chat.completions.create({
    model: 'm3-tiny', messages: [{ role: 'user', content: script('x'.repeat(60), { stepMs: 20 }) }],
  });
  await waitFor(async () => metricValue(await metrics(srv.serverUrl), `m3serve:num_requests_running${M}`) === 1);
  srv.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 100));
  // New work is refused while draining (503, or the listener is already closed).
  try {
    const r = await fetch(`${srv.url}/v1/chat/completions`, {
      method: 'POST', body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }),
    });
    assert.equal(r.status, 503);
  } catch (e) {
    assert.match(String(e.cause?.code ?? e), /ECONNREFUSED|ECONNRESET|fetch failed/);
  }
  const done = await inflight;
  assert.equal(done.choices[0].message.content, 'x'.repeat(60));
  const { code } = await srv.exited;
  assert.equal(code, 0);
  assert.match(srv.log(), /draining 1 in-flight/);
});
