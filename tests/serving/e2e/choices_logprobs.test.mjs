// n > 1, logprobs, --kv-cache-bytes and the detokenizer's end-of-request flush, end to end on
// the real bundled model, through the official `openai` npm client against `m3serve serve`.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL, startServer, stopServer, metricValue, serveExpectingFailure } from './helpers.mjs';

const KV_BYTES = 48 << 20;
let srv;

before(async () => {
  srv = await startServer(['--max-running-requests', '32', '--kv-cache-bytes', String(KV_BYTES)]);
});

after(async () => {
  assert.equal(await stopServer(srv), 0, srv?.log());
});

const hello = [{ role: 'user', content: 'Hello! How are you today?' }];

// Checks one chat logprobs entry: OpenAI's shape, bytes = the token's UTF-8, `top` alternatives
// sorted by logprob.
function checkEntry(e, top) {
  assert.equal(typeof e.token, 'string');
  assert.ok(e.logprob <= 0, JSON.stringify(e));
  assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
  assert.equal(e.top_logprobs.length, top, JSON.stringify(e));
  for (let k = 1; k < e.top_logprobs.length; ++k) {
    assert.ok(e.top_logprobs[k - 1].logprob >= e.top_logprobs[k].logprob, JSON.stringify(e));
  }
  for (const t of e.top_logprobs) assert.deepEqual(t.bytes, [...Buffer.from(t.token, 'utf8')]);
}

test('the KV pool is whole pages within --kv-cache-bytes, reported at startup and in /metrics', async () => {
  const m = srv.log().match(/KV cache (\d+) bytes \(--kv-cache-bytes \d+\): (\d+) pages of (\d+) tokens, (\d+) bytes per page/);
  assert.ok(m, srv.log());
  const pages = Number(m[2]);
  assert.equal(pages, Math.floor(KV_BYTES / Number(m[4])));
  assert.equal(Number(m[1]), pages * Number(m[4]), 'the pool is whole pages of the given size');
  assert.equal(await metricValue(srv, 'm3serve:kv_pages_total'), pages);
});

// 10 kB is less than one page of m3-tiny in every --kv-cache-dtype (the suite runs again over an
// fp8 cache: M3_SERVE_ARGS); fp4, the smallest, takes ~17 kB per page of 32 tokens.
test('--kv-cache-bytes too small for one request is an error naming the flag', async () => {
  const { code, log } = await serveExpectingFailure(['--kv-cache-bytes', '10000']);
  assert.equal(code, 1, log);
  assert.match(log, /--kv-cache-bytes 10000 holds \d+ KV pages/);
});

test('greedy chat logprobs: the generated token is the most likely, top lists sorted', async () => {
  const r = await srv.client.chat.completions.create({
    // No penalties: greedy then picks the argmax of the raw distribution the logprobs describe.
    model: MODEL, messages: hello, temperature: 0, repetition_penalty: 1, max_tokens: 12,
    logprobs: true, top_logprobs: 5, thinking: { type: 'disabled' },
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const e of content) {
    checkEntry(e, 5);
    const maxP = Math.max(...e.top_logprobs.map((t) => Math.exp(t.logprob)));
    assert.equal(Math.exp(e.logprob), maxP, JSON.stringify(e));
    assert.equal(e.top_logprobs[0].token, e.token);
  }
});

test('n = 3 with a seed: three different choices, reproducible, usage summed', async () => {
  const body = {
    model: MODEL, messages: hello, temperature: 1, max_tokens: 16, n: 3, seed: 1234, logprobs: true,
  };
  const a = await srv.client.chat.completions.create(body);
  const b = await srv.client.chat.completions.create(body);
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
  const texts = (r) => r.choices.map((c) => `${c.message.reasoning_content ?? ''}|${c.message.content ?? ''}`);
  assert.deepEqual(texts(a), texts(b));
  assert.ok(new Set(texts(a)).size >= 2, JSON.stringify(texts(a)));
  const one = await srv.client.chat.completions.create({ ...body, n: 1 });
  assert.equal(a.usage.prompt_tokens, one.usage.prompt_tokens);
  // Each choice's logprobs have one entry per token: they give the per-choice counts.
  const perChoice = a.choices.map((c) => c.logprobs.content.length);
  assert.equal(a.usage.completion_tokens, perChoice.reduce((x, y) => x + y, 0));
  assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens);
  // n = 1 with the same seed is choice 0 of n = 3.
  assert.equal(texts(one)[0], texts(a)[0]);
});

test('streaming n = 2 completions with logprobs', async () => {
  const s = await srv.client.completions.create({
    model: MODEL, prompt: 'Once upon a time', max_tokens: 10, temperature: 0.8, seed: 3, n: 2,
    logprobs: 3, stream: true, stream_options: { include_usage: true },
  });
  const text = ['', ''];
  const tokens = [[], []];
  const finish = [null, null];
  let usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      assert.equal(finish[ch.index], null, 'a chunk after the finish');
      text[ch.index] += ch.text;
      if (ch.logprobs) {
        const lp = ch.logprobs;
        assert.equal(lp.tokens.length, lp.token_logprobs.length);
        assert.equal(lp.tokens.length, lp.top_logprobs.length);
        assert.equal(lp.tokens.length, lp.text_offset.length);
        // (JS orders integer-like keys first, so the dict's order is not checked here; the
        // server's gtest checks it on the wire.) Two ids decoding alike share a key: <= 3.
        lp.top_logprobs.forEach((top, i) => {
          const values = Object.values(top);
          assert.ok(values.length >= 1 && values.length <= 3, JSON.stringify(top));
          assert.ok(values.every((v) => v <= 0));
          if (lp.tokens[i] in top) assert.ok(top[lp.tokens[i]] >= lp.token_logprobs[i] - 1e-6);
        });
        tokens[ch.index].push(...lp.tokens);
      }
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  for (const i of [0, 1]) {
    assert.ok(['stop', 'length'].includes(finish[i]), `choice ${i}: ${finish[i]}`);
    assert.ok(tokens[i].length >= 1 && tokens[i].length <= 10);
  }
  assert.equal(usage.completion_tokens, tokens[0].length + tokens[1].length);
});

test('n above 16 is a 400 naming n', async () => {
  await assert.rejects(
    srv.client.chat.completions.create({ model: MODEL, messages: hello, n: 17 }),
    (e) => e.status === 400 && e.param === 'n' && /16/.test(e.message),
  );
});

test('disconnect cancels every choice', async () => {
  const controller = new AbortController();
  const s = await srv.client.chat.completions.create({
    model: MODEL, messages: hello, max_tokens: 3000, ignore_eos: true, n: 3, stream: true,
  }, { signal: controller.signal });
  let n = 0;
  for await (const c of s) {
    void c;
    if (++n === 12) controller.abort();
  }
  const until = Date.now() + 10000;
  while (Date.now() < until && (await metricValue(srv, 'm3serve:num_requests_running')) !== 0) {
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(await metricValue(srv, 'm3serve:num_requests_running'), 0);
});

async function post(route, body) {
  const r = await fetch(`${srv.url}${route}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  assert.equal(r.status, 200);
  return r.json();
}

test('a completion that ends mid-character ends with U+FFFD (not dropped)', async () => {
  // A token that is a lone piece of a character the vocabulary splits into bytes.
  let piece = null;
  for (const text of ['\u{1F600}', '\u4E2D', '\u00E9']) {
    const { tokens } = await post('/tokenize', { prompt: text });
    if (tokens.length < 2) continue;
    const { prompt } = await post('/detokenize', { tokens: [tokens[0]] });
    if (prompt === '\uFFFD') { piece = tokens[0]; break; }
  }
  assert.notEqual(piece, null, 'no character is split into byte pieces');
  const body = { model: MODEL, prompt: 'Hello', max_tokens: 1, temperature: 0, logit_bias: { [piece]: 100 } };
  const r = await srv.client.completions.create(body);
  assert.equal(r.choices[0].text, '\uFFFD');
  assert.equal(r.choices[0].finish_reason, 'length');
  const s = await srv.client.completions.create({ ...body, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  assert.equal(text, '\uFFFD');
});
