// Load test (a benchmark, not a test): streaming chat requests against a running `m3serve serve`
// at several concurrencies; reports requests/s, output tokens/s, TTFT and inter-token latency.
//   node tests/serving/load.mjs [--url http://127.0.0.1:30000] [--concurrency 1,8,64]
//                               [--requests-per-worker 4] [--max-tokens 64]
// Every request generates exactly --max-tokens tokens (ignore_eos), sampled at temperature 0.7.
import OpenAI from 'openai';

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : def;
};
const url = arg('url', 'http://127.0.0.1:30000');
const levels = arg('concurrency', '1,8,64').split(',').map(Number);
const perWorker = Number(arg('requests-per-worker', '4'));
const maxTokens = Number(arg('max-tokens', '64'));
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 600000 });

const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

async function one(i) {
  const t0 = performance.now();
  let first = null;
  let last = null;
  const gaps = [];
  let tokens = 0;
  const s = await client.chat.completions.create({
    model: 'm3-tiny', messages: [{ role: 'user', content: `What is ${i % 97} + ${(7 * i) % 89}?` }],
    max_tokens: maxTokens, ignore_eos: true, temperature: 0.7, seed: i, stream: true,
    stream_options: { include_usage: true },
  });
  for await (const c of s) {
    const now = performance.now();
    const d = c.choices[0]?.delta;
    if (d && (d.content || d.reasoning_content || d.tool_calls)) {
      if (first === null) first = now;
      else gaps.push(now - last);
      last = now;
    }
    if (c.usage) tokens = c.usage.completion_tokens;
  }
  return { ttft: first - t0, gaps, tokens };
}

for (const c of levels) {
  const t0 = performance.now();
  let next = 0;
  const results = [];
  await Promise.all(Array.from({ length: c }, async () => {
    for (let k = 0; k < perWorker; ++k) results.push(await one(next++));
  }));
  const secs = (performance.now() - t0) / 1000;
  const toks = results.reduce((a, r) => a + r.tokens, 0);
  const ttft = results.map((r) => r.ttft);
  const itl = results.flatMap((r) => r.gaps);
  console.log(`concurrency ${c}: ${results.length} requests in ${secs.toFixed(2)} s, ` +
    `${(results.length / secs).toFixed(2)} req/s, ${(toks / secs).toFixed(1)} output tok/s, ` +
    `TTFT p50 ${pct(ttft, 50).toFixed(1)} ms p99 ${pct(ttft, 99).toFixed(1)} ms, ` +
    `ITL p50 ${pct(itl, 50).toFixed(1)} ms p99 ${pct(itl, 99).toFixed(1)} ms`);
}
