// End-to-end on the real bundled model: `m3serve serve` (no --model-path: models/m3-tiny on the
// CPU) driven by the official `openai` npm client. One server for the whole file (loading is
// cheap, but generation is CPU time shared by the CI's two cores): short max_tokens throughout.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import {
  MODEL, repoRoot, startServer, stopServer, waitFor, metricValue as metricOf,
} from './helpers.mjs';

const golden = JSON.parse(readFileSync(path.join(repoRoot, 'tests/fixtures/m3_tiny/golden.json'), 'utf8'));
const goldenCase = (name) => golden.cases.find((c) => c.name === name);

let srv;
const metricValue = (name) => metricOf(srv, name);

async function tokenize(body) {
  const r = await fetch(`${srv.url}/tokenize`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  assert.equal(r.status, 200);
  return r.json();
}

function fold(chunks) {
  const out = { reasoning: '', content: '', toolCalls: [], finishReason: null, usage: null };
  for (const c of chunks) {
    if (c.usage) out.usage = c.usage;
    for (const ch of c.choices ?? []) {
      const d = ch.delta ?? {};
      if (d.reasoning_content) {
        assert.equal(out.content, '', 'reasoning after content');
        out.reasoning += d.reasoning_content;
      }
      if (d.content) out.content += d.content;
      for (const tc of d.tool_calls ?? []) {
        if (tc.id) out.toolCalls.push({ id: tc.id, name: tc.function?.name, arguments: '' });
        out.toolCalls[tc.index].arguments += tc.function?.arguments ?? '';
      }
      if (ch.finish_reason) out.finishReason = ch.finish_reason;
    }
  }
  return out;
}

before(async () => {
  srv = await startServer(['--max-running-requests', '32']);
});

after(async () => {
  if (srv) assert.equal(await stopServer(srv), 0, srv.log());
});

const addQuestion = [{ role: 'user', content: 'What is 47 + 35?' }];

test('health, models and the default model', async () => {
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  const models = await srv.client.models.list();
  assert.equal(models.data[0].id, MODEL);
});

test('chat, thinking enabled: reasoning_content then content; usage matches /tokenize', async () => {
  const body = { model: MODEL, messages: addQuestion, temperature: 0, max_tokens: 96, thinking: { type: 'enabled' } };
  const r = await srv.client.chat.completions.create(body);
  const m = r.choices[0].message;
  assert.ok(m.reasoning_content && m.reasoning_content.length > 0, JSON.stringify(m));
  assert.ok(m.content && m.content.length > 0, JSON.stringify(m));
  assert.ok(!m.content.includes('<mm:think>') && !m.content.includes('</mm:think>'), m.content);
  assert.ok(!m.reasoning_content.includes('</mm:think>'), m.reasoning_content);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const tok = await tokenize({ model: MODEL, messages: addQuestion, thinking: { type: 'enabled' } });
  assert.equal(r.usage.prompt_tokens, tok.count);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 96);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  // The reasoning tokens are counted: some, and fewer than all (content follows).
  const rt = r.usage.completion_tokens_details.reasoning_tokens;
  assert.ok(rt > 0 && rt < r.usage.completion_tokens, JSON.stringify(r.usage));

  // Streaming gives the same split, reasoning first.
  const s = await srv.client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const c of s) chunks.push(c);
  const f = fold(chunks);
  assert.equal(f.reasoning, m.reasoning_content);
  assert.equal(f.content, m.content);
  assert.equal(f.finishReason, 'stop');
  assert.deepEqual(f.usage.completion_tokens, r.usage.completion_tokens);
  assert.equal(f.usage.completion_tokens_details.reasoning_tokens, rt);
});

test('chat, thinking disabled: content only (non-streaming and streaming)', async () => {
  const c = goldenCase('arith_sub_disabled');
  const body = { model: MODEL, messages: c.messages, temperature: 0, max_tokens: 48, thinking: { type: 'disabled' } };
  const r = await srv.client.chat.completions.create(body);
  const m = r.choices[0].message;
  assert.ok(!m.reasoning_content, JSON.stringify(m));
  assert.ok(m.content.length > 0);
  assert.ok(!m.content.includes('mm:think'), m.content);
  const s = await srv.client.chat.completions.create({ ...body, stream: true });
  const chunks = [];
  for await (const ch of s) chunks.push(ch);
  const f = fold(chunks);
  assert.equal(f.reasoning, '');
  assert.equal(f.content, m.content);
});

// The golden greedy output's tool call (name and parameters), read from its XML so the test
// follows the bundled model when it is retrained.
const expectedToolName = (c) => goldenToolCall(c).name;

function goldenToolCall(c) {
  const NS = ']<]minimax[>[';
  const start = c.output_text.indexOf(`${NS}<invoke name="`);
  const end = c.output_text.indexOf(`${NS}</invoke>`, start);
  assert.ok(start >= 0 && end > start, `no tool call in the golden output ${c.output_text}`);
  const [head, ...params] = c.output_text.slice(start + NS.length, end).split(NS);
  const args = {};
  for (const p of params) {
    const m = p.match(/^<([A-Za-z_]+)>([\s\S]*)$/);  // an opening tag and its text; closers skipped
    if (m) args[m[1]] = m[2];
  }
  return { name: head.match(/^<invoke name="([^"]+)">/)[1], args };
}

test('tool call: OpenAI tool_calls with typed arguments', async () => {
  const c = goldenCase('tool_weather_adaptive');
  const expected = goldenToolCall(c);
  const r = await srv.client.chat.completions.create({
    model: MODEL, messages: c.messages, tools: c.tools, temperature: 0, max_tokens: c.output_ids.length + 8,
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, expected.name);
  // All of get_weather's parameters are strings in its schema: the typed arguments are the text.
  assert.deepEqual(JSON.parse(call.function.arguments), expected.args);
  assert.ok(!(choice.message.content ?? '').includes('minimax'), choice.message.content);
  assert.ok(!(choice.message.reasoning_content ?? '').includes('minimax'));
});

test('tool_choice none / required / named on the bundled model (streamed == whole)', async () => {
  const c = goldenCase('tool_weather_adaptive');
  const names = c.tools.map((t) => t.function.name);
  const ask = (tool_choice, extra = {}) => srv.client.chat.completions.create({
    model: MODEL, messages: c.messages, tools: c.tools, tool_choice, temperature: 0, max_tokens: 64, ...extra,
  });
  // none: the tools leave the prompt and no call is parsed; no markup reaches the content.
  const none = await ask('none');
  assert.equal(none.choices[0].message.tool_calls, undefined, JSON.stringify(none.choices[0].message));
  assert.notEqual(none.choices[0].finish_reason, 'tool_calls');
  assert.ok(!(none.choices[0].message.content ?? '').includes('minimax'), none.choices[0].message.content);
  const tokNone = await tokenize({ messages: c.messages, tools: c.tools, tool_choice: 'none' });
  assert.equal(none.usage.prompt_tokens, tokNone.count);
  assert.ok(tokNone.count < (await tokenize({ messages: c.messages, tools: c.tools })).count);
  // required: some declared tool is called, arguments are a JSON object.
  const req = await ask('required');
  const rc = req.choices[0].message.tool_calls;
  assert.ok(rc?.length >= 1, JSON.stringify(req.choices[0].message));
  assert.ok(names.includes(rc[0].function.name), rc[0].function.name);
  assert.equal(typeof JSON.parse(rc[0].function.arguments), 'object');
  // named: that tool is called even though the request asks about the weather.
  const forced = c.tools.find((t) => t.function.name !== expectedToolName(c)).function.name;
  const named = await ask({ type: 'function', function: { name: forced } });
  const nc = named.choices[0].message.tool_calls;
  assert.equal(nc?.[0]?.function.name, forced, JSON.stringify(named.choices[0].message));
  assert.equal(typeof JSON.parse(nc[0].function.arguments), 'object');
  const s = await ask({ type: 'function', function: { name: forced } }, { stream: true });
  const chunks = [];
  for await (const ch of s) chunks.push(ch);
  const f = fold(chunks);
  assert.deepEqual(f.toolCalls.map((t) => [t.name, t.arguments]),
    nc.map((t) => [t.function.name, t.function.arguments]));
  assert.equal(f.finishReason, named.choices[0].finish_reason);
});

test('/v1/completions: text and usage consistent with /tokenize', async () => {
  const prompt = 'What is 47 + 35?';
  const r = await srv.client.completions.create({ model: MODEL, prompt, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  const tok = await tokenize({ prompt });
  assert.equal(r.usage.prompt_tokens, tok.count);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, 8);
  // Token-id prompts: the rendered golden prompt gives the golden greedy continuation.
  const c = goldenCase('chitchat_hello');
  const ids = await srv.client.completions.create({ model: MODEL, prompt: c.prompt_ids, max_tokens: 16, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, c.prompt_ids.length);
  assert.equal(ids.usage.completion_tokens, c.output_ids.length);
  assert.equal(ids.choices[0].finish_reason, 'stop');
});

test('a repeated long prompt is served from the prefix cache', async () => {
  const c = goldenCase('tool_result_answer_multiturn');
  const body = { model: MODEL, messages: c.messages, tools: c.tools, temperature: 0, max_tokens: 4 };
  const first = await srv.client.chat.completions.create(body);
  const second = await srv.client.chat.completions.create(body);
  assert.ok(first.usage.prompt_tokens > 500);
  const cached = second.usage.prompt_tokens_details?.cached_tokens ?? 0;
  assert.ok(cached >= first.usage.prompt_tokens - 64, `cached ${cached} of ${first.usage.prompt_tokens}`);
  assert.ok(cached < second.usage.prompt_tokens);
});

test('same seed, same sample at temperature 1', async () => {
  const body = { model: MODEL, messages: [{ role: 'user', content: 'Hello!' }], temperature: 1, max_tokens: 24 };
  const outs = [];
  // m3-tiny's reply to this is peaked (about three in four samples are the same reply), so a few
  // seeds can all draw it under a given random stream (speculative decoding draws from other
  // streams than plain decoding): eight different seeds must give at least two replies.
  for (const seed of [7, 7, 8, 9, 10, 11, 12, 13, 14]) {
    const r = await srv.client.chat.completions.create({ ...body, seed });
    const m = r.choices[0].message;
    outs.push(`${m.reasoning_content ?? ''}|${m.content ?? ''}|${r.usage.completion_tokens}`);
  }
  assert.equal(outs[0], outs[1]);
  assert.ok(new Set(outs).size >= 2, `seeds 7 to 14 all gave ${outs[0]}`);
});

test('100 concurrent streams all finish, each with its own usage', async () => {
  const N = 100;
  let peakRunning = 0;
  const poll = setInterval(async () => {
    try {
      peakRunning = Math.max(peakRunning, await metricValue('m3serve:num_requests_running'));
    } catch { /* busy */ }
  }, 20);
  const runs = Array.from({ length: N }, async (_, i) => {
    const s = await srv.client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: `What is ${i} + ${2 * i}?` }],
      max_tokens: 12, temperature: 0.7, seed: i, stream: true, stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of s) chunks.push(c);
    return fold(chunks);
  });
  const results = await Promise.all(runs);
  clearInterval(poll);
  assert.equal(results.length, N);
  for (const f of results) {
    assert.ok(['stop', 'length'].includes(f.finishReason), JSON.stringify(f));
    assert.ok(f.usage.completion_tokens >= 1 && f.usage.completion_tokens <= 12);
    assert.ok(f.usage.prompt_tokens > 0);
    if (f.finishReason === 'length') assert.equal(f.usage.completion_tokens, 12);
  }
  // They really ran together: --max-running-requests 32 is reached (the rest wait their turn).
  assert.ok(peakRunning >= 16, `peak running ${peakRunning}`);
  assert.ok(await waitFor(async () => (await metricValue('m3serve:num_requests_running')) === 0
    && (await metricValue('m3serve:num_requests_waiting')) === 0));
});

test('client disconnect mid-stream returns the KV pages', async () => {
  assert.ok(await waitFor(async () => (await metricValue('m3serve:kv_pages_used')) === 0));
  const baseline = await metricValue('m3serve:kv_pages_used');
  const controller = new AbortController();
  const s = await srv.client.chat.completions.create({
    model: MODEL, messages: addQuestion, max_tokens: 3000, ignore_eos: true, temperature: 0, stream: true,
  }, { signal: controller.signal });
  let n = 0;
  let sawPages = false;
  let finishReason = null;
  // The openai client ends the iteration quietly on abort (no AbortError).
  for await (const c of s) {
    finishReason = c.choices[0]?.finish_reason ?? finishReason;
    if (++n === 5) sawPages = (await metricValue('m3serve:kv_pages_used')) > baseline;
    if (n === 8) controller.abort();
  }
  assert.ok(n >= 8 && n < 1000, `chunks: ${n}`);
  assert.equal(finishReason, null);
  assert.ok(sawPages, 'the running request held no KV pages');
  assert.ok(await waitFor(async () => (await metricValue('m3serve:kv_pages_used')) === baseline
    && (await metricValue('m3serve:num_requests_running')) === 0), 'KV pages not returned');
});
