// Speculative decoding on the server: `m3serve serve --speculative-algorithm DSPARK` with a random
// DSpark draft (--speculative-draft-load-format dummy) next to the real bundled m3-tiny, against
// a plain server. Greedy output is the target's whatever the draft proposes, so the two servers
// must agree token for token; the speculative counters must move; pages must come back.
// Run by the serving_e2e_dspark CTest after the general suite under the same flags.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { MODEL, startServer, stopServer, waitFor, metricValue } from '../helpers.mjs';

const DSPARK = ['--speculative-algorithm', 'DSPARK', '--speculative-draft-load-format', 'dummy'];
let spec, plain;

before(async () => {
  // This file chooses its servers' flags itself.
  delete process.env.M3_SERVE_ARGS;
  spec = await startServer([...DSPARK, '--max-running-requests', '8']);
  plain = await startServer(['--max-running-requests', '8']);
});

after(async () => {
  if (spec) assert.equal(await stopServer(spec), 0, spec.log());
  if (plain) assert.equal(await stopServer(plain), 0, plain.log());
});

async function complete(srv, body) {
  const r = await fetch(`${srv.url}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, ...body }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}

test('the startup report names the draft and its memory', () => {
  assert.match(spec.log(), /speculative decoding: DSpark draft, block \d+/);
  assert.match(spec.log(), /draft memory: DSpark weights [\d.]+ [kMG]?B \(float32\); context cache/);
});

test('greedy output and logprobs equal the plain server, with verify steps counted', async () => {
  const body = { prompt: 'The capital of France is', max_tokens: 40, temperature: 0,
    ignore_eos: true, logprobs: 2 };
  const [a, b] = await Promise.all([complete(spec, body), complete(plain, body)]);
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.deepEqual(a.choices[0].logprobs.tokens, b.choices[0].logprobs.tokens);
  assert.deepEqual(a.choices[0].logprobs.token_logprobs, b.choices[0].logprobs.token_logprobs);
  const s = a.usage.m3serve_spec;
  assert.ok(s && s.spec_verify_ct > 0, JSON.stringify(a.usage));
  assert.ok(s.spec_draft_token_num >= s.spec_verify_ct);
  assert.equal(b.usage.m3serve_spec, undefined, 'no draft, no speculative usage');
});

test('a repeated prompt is served from the prefix cache and decodes the same', async () => {
  // Several KV pages of prompt; the second request reads them from the cache.
  const prompt = Array.from({ length: 300 }, (_, i) => 1000 + ((i * 37) % 2000));
  const body = { prompt, max_tokens: 24, temperature: 0, ignore_eos: true };
  const first = await complete(spec, body);
  const second = await complete(spec, body);
  const want = await complete(plain, body);
  const cached = second.usage.prompt_tokens_details?.cached_tokens ?? 0;
  assert.ok(cached >= 256, `cached ${cached} of ${second.usage.prompt_tokens}`);
  assert.equal(second.choices[0].text, first.choices[0].text);
  assert.equal(first.choices[0].text, want.choices[0].text);
  assert.ok(second.usage.m3serve_spec.spec_verify_ct > 0);
});

test('n = 2 sampled streams with a stop string, then an abort: the pages come back', async () => {
  const stream = await spec.client.completions.create({
    model: MODEL, prompt: 'Once upon a time', max_tokens: 30, temperature: 1, seed: 5, n: 2,
    stop: ['\n\n'], stream: true,
  });
  const finished = new Set();
  for await (const c of stream) for (const ch of c.choices) if (ch.finish_reason) finished.add(ch.index);
  assert.deepEqual([...finished].sort(), [0, 1]);
  const controller = new AbortController();
  const s2 = await spec.client.completions.create({
    model: MODEL, prompt: 'Count: 1, 2, 3,', max_tokens: 200, temperature: 0, ignore_eos: true,
    stream: true,
  }, { signal: controller.signal });
  let n = 0;
  for await (const c of s2) { if (c && ++n === 6) controller.abort(); }
  assert.ok(await waitFor(async () => (await metricValue(spec, 'm3serve:kv_pages_used')) === 0
    && (await metricValue(spec, 'm3serve:num_requests_running')) === 0, 20000),
  'pages left after the requests ended');
  assert.ok((await metricValue(spec, 'm3serve:spec_draft_tokens_total')) > 0);
  assert.ok((await metricValue(spec, 'm3serve:spec_accept_length_count')) > 0);
});
