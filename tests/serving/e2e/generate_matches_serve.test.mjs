// One generation path: `m3serve generate` drives the engine `m3serve serve` runs, so the same
// prompt ids, temperature and seed give the same tokens from both, greedy and sampled.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { MODEL, serverBin, startServer, stopServer } from './helpers.mjs';

let srv;
before(async () => { srv = await startServer([]); });
after(async () => { assert.equal(await stopServer(srv), 0, srv?.log()); });

// `parallel`: a rank count for --tp, or the flags themselves (['--tp', '2', '--ep', '2']).
function generate(ids, temperature, seed, maxTokens, parallel = 1) {
  const flags = Array.isArray(parallel) ? parallel : ['--tp', String(parallel)];
  const out = execFileSync(serverBin, ['generate', '--prompt-ids', ids.join(','), '--max-tokens',
    String(maxTokens), '--temperature', String(temperature), '--seed', String(seed),
    '--ignore-eos', '--model-path', 'models/m3-tiny', ...flags],
  { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  return JSON.parse(out).output_ids;
}

async function post(path, body) {
  const request = () => fetch(`${srv.url}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  // generate() blocks the event loop for seconds (execFileSync): a pooled keep-alive connection
  // the server closed meanwhile (idle timeout 5 s) fails once; a fresh connection does not.
  const r = await request().catch(request);
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}

for (const [temperature, seed] of [[0, 0], [1, 7], [1, 1234567]]) {
  test(`generate equals /v1/completions at temperature ${temperature}, seed ${seed}`, async () => {
    const { tokens: ids } = await post('/tokenize', { prompt: 'What is 47 + 35?' });
    const maxTokens = 24;
    const fromGenerate = generate(ids, temperature, seed, maxTokens);
    assert.equal(fromGenerate.length, maxTokens);
    const completion = await post('/v1/completions', {
      model: MODEL, prompt: ids, max_tokens: maxTokens, temperature, seed, ignore_eos: true,
    });
    assert.equal(completion.usage.completion_tokens, maxTokens);
    const { prompt: text } = await post('/detokenize', { tokens: fromGenerate, skip_special_tokens: true });
    assert.equal(completion.choices[0].text, text);
  });
}

test('sampled generate depends on the seed', () => {
  const ids = [4066, 1, 2, 3, 4, 5];
  const a = generate(ids, 1, 1, 16), b = generate(ids, 1, 2, 16), a2 = generate(ids, 1, 1, 16);
  assert.deepEqual(a, a2);
  assert.notDeepEqual(a, b);
});

// Tensor parallelism on CPU ranks changes only the order of float32 sums (tests/model/
// tensor_parallel_test.cpp bounds it far below the model's logit margins): the same tokens.
// These run `generate` alone, whatever server the suite starts: once, in the plain run.
const onceOnly = { skip: process.env.M3_SERVE_ARGS ? 'runs in the suite without M3_SERVE_ARGS' : false };

test('generate --tp 2 and --tp 4 equal --tp 1, greedy and sampled', onceOnly, () => {
  const ids = [4066, 1, 2, 3, 4, 5, 6, 7, 8, 9];
  for (const [temperature, seed] of [[0, 0], [1, 7]]) {
    const one = generate(ids, temperature, seed, 24);
    assert.deepEqual(generate(ids, temperature, seed, 24, 2), one, `tp 2, temperature ${temperature}`);
    assert.deepEqual(generate(ids, temperature, seed, 24, 4), one, `tp 4, temperature ${temperature}`);
  }
});

// Expert parallelism on CPU ranks (tests/model/tensor_parallel_test.cpp bounds its reordered sums
// the same way): the same tokens as one rank, and generate --tp 2 --ep 2 equals the server's
// completion (whichever layout the suite's server runs: M3_SERVE_ARGS).
// (--tp 2 --ep 2 is compared with the server below, greedy and sampled.)
test('generate --ep 4, --tp 4 --ep 2 and --enable-expert-parallel equal --tp 1', onceOnly, () => {
  const ids = [4066, 1, 2, 3, 4, 5, 6, 7, 8, 9];
  const one = generate(ids, 1, 7, 24);
  for (const flags of [['--ep', '4'], ['--tp', '4', '--ep', '2'],
    ['--tp', '2', '--enable-expert-parallel']]) {
    assert.deepEqual(generate(ids, 1, 7, 24, flags), one, flags.join(' '));
  }
});

for (const [temperature, seed] of [[0, 0], [1, 7]]) {
  test(`generate --tp 2 --ep 2 equals /v1/completions at temperature ${temperature}`, async () => {
    const { tokens: ids } = await post('/tokenize', { prompt: 'What is 47 + 35?' });
    const maxTokens = 24;
    const fromGenerate = generate(ids, temperature, seed, maxTokens, ['--tp', '2', '--ep', '2']);
    const completion = await post('/v1/completions', {
      model: MODEL, prompt: ids, max_tokens: maxTokens, temperature, seed, ignore_eos: true,
    });
    const { prompt: text } = await post('/detokenize', { tokens: fromGenerate, skip_special_tokens: true });
    assert.equal(completion.choices[0].text, text);
  });
}
