// /v1/chat/completions through the official openai client: content, streaming usage, reasoning,
// tool calls (streamed == whole, for several tokens per step), tool_choice, round-trip.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, script, tag, invoke, toolBlock, foldChunks, NS,
} from './helpers.mjs';

let srv;
before(async () => {
  srv = await startServer(['--served-model-name', 'm3-test', '--fake-step-ms', '1']);
});
after(async () => {
  const { code } = await srv.stop();
  assert.equal(code, 0, 'SIGTERM exits cleanly');
});

const weatherTools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather for a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string' },
          days: { type: 'integer' },
          metric: { type: 'boolean' },
          hours: { type: 'array', items: { type: 'integer' } },
          where: { type: 'object', properties: { lat: { type: 'number' }, lon: { type: 'number' } } },
        },
        required: ['city'],
      },
    },
  },
  {
    type: 'function',
    function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string' } } } },
  },
];

async function both(params, tpsList = [1, 3, 8]) {
  const whole = await srv.client.chat.completions.create({ ...params, stream: false });
  const streams = [];
  for (const tps of tpsList) {
    const msgs = params.messages.map((m) =>
      m.role === 'user' ? { ...m, content: m.content.replace(/FAKE_TPS=\d+/, `FAKE_TPS=${tps}`) } : m);
    const chunks = [];
    const stream = await srv.client.chat.completions.create({
      ...params, messages: msgs, stream: true, stream_options: { include_usage: true },
    });
    for await (const c of stream) chunks.push(c);
    streams.push({ tps, chunks, folded: foldChunks(chunks) });
  }
  return { whole, streams };
}

test('models list names the served model', async () => {
  const models = await srv.client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['m3-test']);
  const one = await srv.client.models.retrieve('m3-test');
  assert.equal(one.id, 'm3-test');
});

test('plain chat, streaming and not, with usage', async () => {
  const text = 'Paris is the capital of France. ü 😀 中文';
  const { whole, streams } = await both({
    model: 'm3-test', messages: [{ role: 'user', content: script(text) }],
  });
  const msg = whole.choices[0].message;
  assert.equal(msg.content, text);
  assert.equal(msg.reasoning_content, null);
  assert.equal(whole.choices[0].finish_reason, 'stop');
  const bytes = Buffer.byteLength(text);
  assert.equal(whole.usage.completion_tokens, bytes + 1, 'byte-level tokens plus EOS');
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
  assert.equal(whole.usage.prompt_tokens_details.cached_tokens >= 0, true);
  assert.equal(whole.usage.completion_tokens_details.reasoning_tokens, 0);
  for (const s of streams) {
    assert.equal(s.folded.content, text, `tps ${s.tps}`);
    assert.equal(s.folded.finishReason, 'stop');
    const last = s.chunks.at(-1);
    assert.deepEqual(last.choices, [], 'the usage chunk has no choices');
    assert.equal(last.usage.completion_tokens, bytes + 1);
    assert.equal(s.chunks[0].choices[0].delta.role, 'assistant');
  }
});

test('prefix cache hits show up as cached_tokens', async () => {
  const long = 'x'.repeat(600);
  const params = { model: 'm3-test', messages: [{ role: 'user', content: `${long} ${script('ok')}` }] };
  await srv.client.chat.completions.create(params);
  const again = await srv.client.chat.completions.create(params);
  assert.ok(again.usage.prompt_tokens_details.cached_tokens >= 512,
    `cached ${again.usage.prompt_tokens_details.cached_tokens}`);
  assert.equal(again.usage.prompt_tokens_details.cached_tokens % 128, 0);
});

test('reasoning goes to reasoning_content (thinking enabled: prefilled opener)', async () => {
  const out = 'Let me think about it.\n</mm:think>\n\nThe answer is 4.';
  const { whole, streams } = await both({
    model: 'm3-test', messages: [{ role: 'user', content: script(out) }], thinking: { type: 'enabled' },
  });
  const msg = whole.choices[0].message;
  assert.equal(msg.reasoning_content, 'Let me think about it.');
  assert.equal(msg.content, 'The answer is 4.');
  // 'Let me think about it.\n' is 23 byte tokens, plus the closer.
  assert.equal(whole.usage.completion_tokens_details.reasoning_tokens, 24);
  for (const s of streams) {
    assert.equal(s.folded.reasoning, msg.reasoning_content, `tps ${s.tps}`);
    assert.equal(s.folded.content, msg.content);
    assert.equal(s.folded.usage.completion_tokens_details.reasoning_tokens, 24);
  }
});

test('adaptive mode: a stray leading closer is dropped; an opener starts reasoning', async () => {
  const a = await srv.client.chat.completions.create({
    model: 'm3-test', messages: [{ role: 'user', content: script('</mm:think>\n\nDirect.') }],
  });
  assert.equal(a.choices[0].message.content, 'Direct.');
  assert.equal(a.choices[0].message.reasoning_content, null);
  const b = await srv.client.chat.completions.create({
    model: 'm3-test', messages: [{ role: 'user', content: script('<mm:think>hmm</mm:think>ok') }],
  });
  assert.equal(b.choices[0].message.reasoning_content, 'hmm');
  assert.equal(b.choices[0].message.content, 'ok');
});

test('tool calls: typed arguments, several per turn, streamed == whole', async () => {
  const out = 'Checking both.\n' + toolBlock(
    invoke('get_weather', tag('city', 'Paris') + tag('days', '3') + tag('metric', 'true') +
      tag('hours', tag('item', '9') + tag('item', '18')) +
      tag('where', tag('lat', '48.85') + tag('lon', '2.35'))),
    invoke('get_time', tag('tz', 'Europe/Paris')),
  );
  const { whole, streams } = await both({
    model: 'm3-test', tools: weatherTools, messages: [{ role: 'user', content: script(out) }],
  }, [1, 2, 5, 13]);
  const msg = whole.choices[0].message;
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, 'Checking both.');
  assert.equal(msg.tool_calls.length, 2);
  assert.equal(msg.tool_calls[0].type, 'function');
  assert.match(msg.tool_calls[0].id, /^call_/);
  assert.equal(msg.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), {
    city: 'Paris', days: 3, metric: true, hours: [9, 18], where: { lat: 48.85, lon: 2.35 },
  });
  assert.deepEqual(JSON.parse(msg.tool_calls[1].function.arguments), { tz: 'Europe/Paris' });
  assert.ok(!msg.content.includes('minimax'));
  for (const s of streams) {
    assert.equal(s.folded.finishReason, 'tool_calls', `tps ${s.tps}`);
    assert.equal(s.folded.content, msg.content);
    assert.deepEqual(s.folded.toolCalls.map((c) => [c.name, c.arguments]),
      msg.tool_calls.map((c) => [c.function.name, c.function.arguments]));
  }
  // Arguments stream as they are generated: with one token per step the string value arrives in
  // several deltas.
  const argDeltas = streams[0].chunks.flatMap((c) => c.choices?.[0]?.delta?.tool_calls ?? [])
    .filter((t) => t.index === 0).length;
  assert.ok(argDeltas > 10, `only ${argDeltas} argument deltas`);
});

test('parallel_tool_calls false reports only the first call, streamed == whole', async () => {
  const out = toolBlock(invoke('get_time', tag('tz', 'UTC')), invoke('get_weather', tag('city', 'Oslo')));
  const { whole, streams } = await both({
    model: 'm3-test', tools: weatherTools, parallel_tool_calls: false,
    messages: [{ role: 'user', content: script(out) }],
  }, [1, 3]);
  const calls = whole.choices[0].message.tool_calls;
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
    [['get_time', { tz: 'UTC' }]]);
  for (const s of streams) {
    assert.deepEqual(s.folded.toolCalls.map((c) => [c.name, c.arguments]),
      calls.map((c) => [c.function.name, c.function.arguments]), `tps ${s.tps}`);
  }
});

test('the official stream helper accumulates our tool-call deltas', async () => {
  const out = toolBlock(invoke('get_time', tag('tz', 'UTC')), invoke('get_weather', tag('city', 'Oslo')));
  const stream = srv.client.chat.completions.stream({
    model: 'm3-test', tools: weatherTools, messages: [{ role: 'user', content: script(out, { tps: 4 }) }],
  });
  const final = await stream.finalChatCompletion();
  const calls = final.choices[0].message.tool_calls;
  assert.deepEqual(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
    [['get_time', { tz: 'UTC' }], ['get_weather', { city: 'Oslo' }]]);
});

test('tool_choice named and required force a call; none disables parsing', async () => {
  // Named: the server prefills the invoke, so the model output starts inside it.
  const named = await srv.client.chat.completions.create({
    model: 'm3-test', tools: weatherTools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    messages: [{ role: 'user', content: script(`${tag('city', 'Rome')}${NS}</invoke>\n${NS}</tool_call>`) }],
  });
  assert.equal(named.choices[0].finish_reason, 'tool_calls');
  assert.equal(named.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(named.choices[0].message.tool_calls[0].function.arguments), { city: 'Rome' });

  const required = await srv.client.chat.completions.create({
    model: 'm3-test', tools: weatherTools, tool_choice: 'required',
    messages: [{ role: 'user', content: script(`${invoke('get_time', '')}\n${NS}</tool_call>`) }],
  });
  assert.equal(required.choices[0].message.tool_calls[0].function.name, 'get_time');
  assert.equal(required.choices[0].message.tool_calls[0].function.arguments, '{}');

  const none = await srv.client.chat.completions.create({
    model: 'm3-test', tools: weatherTools, tool_choice: 'none',
    messages: [{ role: 'user', content: script('No tools needed.') }],
  });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal(none.choices[0].message.content, 'No tools needed.');

  await assert.rejects(srv.client.chat.completions.create({
    model: 'm3-test', tools: weatherTools, tool_choice: { type: 'function', function: { name: 'nope' } },
    messages: [{ role: 'user', content: 'x' }],
  }), (e) => e.status === 400 && e.param === 'tool_choice.function.name');
});

test('reasoning, tool calls and tool results round-trip into the template', async () => {
  const messages = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Weather in Paris?' },
    {
      role: 'assistant', content: null, reasoning_content: 'I need the weather tool.',
      tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: JSON.stringify({ city: 'Paris', days: 2, extra: null }) } }],
    },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 24C' },
  ];
  const tok = await (await fetch(`${srv.url}/tokenize`, {
    method: 'POST', body: JSON.stringify({ model: 'm3-test', messages, tools: weatherTools }),
  })).json();
  assert.equal(tok.count, tok.tokens.length);
  const detok = await (await fetch(`${srv.url}/detokenize`, {
    method: 'POST', body: JSON.stringify({ tokens: tok.tokens }),
  })).json();
  const prompt = detok.prompt;
  assert.ok(prompt.includes('<mm:think>\nI need the weather tool.\n</mm:think>'), prompt);
  assert.ok(prompt.includes(`${NS}<invoke name="get_weather">${NS}<city>Paris${NS}</city>${NS}<days>2${NS}</days>${NS}</invoke>`), prompt);
  assert.ok(!prompt.includes('<extra>'), 'null arguments are omitted');
  assert.ok(prompt.includes('<response>sunny, 24C</response>'), prompt);
  assert.ok(prompt.includes('Be brief.'));
  assert.ok(prompt.endsWith(']~b]ai\n'), 'generation prompt (adaptive)');
  // Thinking and effort reach the template.
  const t2 = await (await fetch(`${srv.url}/tokenize`, {
    method: 'POST',
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], reasoning_effort: 'xhigh', thinking: { type: 'enabled' } }),
  })).json();
  const p2 = (await (await fetch(`${srv.url}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: t2.tokens }) })).json()).prompt;
  assert.ok(p2.includes('Current thinking mode: enabled'));
  assert.ok(p2.includes('<effort>xhigh</effort>'));
  assert.ok(p2.endsWith('<mm:think>'));
});

test('thinking and reasoning_effort validation', async () => {
  await assert.rejects(srv.client.chat.completions.create({
    model: 'm3-test', messages: [{ role: 'user', content: 'x' }], thinking: { type: 'maybe' },
  }), (e) => e.status === 400 && e.param === 'thinking.type' && /enabled.*disabled.*adaptive/.test(e.message));
  await assert.rejects(srv.client.chat.completions.create({
    model: 'm3-test', messages: [{ role: 'user', content: 'x' }], reasoning_effort: 'extreme',
  }), (e) => e.status === 400 && e.param === 'reasoning_effort');
  const off = await srv.client.chat.completions.create({
    model: 'm3-test', reasoning_effort: 'none', messages: [{ role: 'user', content: script('plain') }],
  });
  assert.equal(off.choices[0].message.content, 'plain');
});

test('errors: unknown model 404, bad JSON 400, context length 400 with both numbers', async () => {
  await assert.rejects(srv.client.chat.completions.create({
    model: 'gpt-9', messages: [{ role: 'user', content: 'x' }],
  }), (e) => e.status === 404 && e.code === 'model_not_found');
  const bad = await fetch(`${srv.url}/v1/chat/completions`, { method: 'POST', body: '{"messages":' });
  assert.equal(bad.status, 400);
  const body = await bad.json();
  assert.deepEqual(Object.keys(body.error).sort(), ['code', 'message', 'param', 'type']);
  await assert.rejects(srv.client.chat.completions.create({
    model: 'm3-test', max_tokens: 100000, messages: [{ role: 'user', content: 'x' }],
  }), (e) => e.status === 400 && /8192 tokens/.test(e.message) && /100000 in the completion/.test(e.message));
  const unknown = await fetch(`${srv.url}/v2/whatever`);
  assert.equal(unknown.status, 404);
  // A field that asks for what the server cannot do is named, not ignored.
  await assert.rejects(srv.client.chat.completions.create({
    model: 'm3-test', messages: [{ role: 'user', content: 'x' }], guided_choice: ['a', 'b'],
  }), (e) => e.status === 400 && e.param === 'guided_choice' && e.code === 'unsupported_parameter');
});

test('continue_final_message continues the assistant message', async () => {
  const r = await srv.client.chat.completions.create({
    model: 'm3-test', max_tokens: 50, continue_final_message: true,
    messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content: script(' and on') }],
  });
  assert.equal(r.choices[0].message.content, ' and on');
  await assert.rejects(srv.client.chat.completions.create({
    model: 'm3-test', continue_final_message: true, messages: [{ role: 'user', content: 'q' }],
  }), (e) => e.status === 400 && e.param === 'continue_final_message');
});

test('images: data URIs validated, remote URLs refused, then a clear 400', async () => {
  const png = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.alloc(16)]);
  const ask = (url) => srv.client.chat.completions.create({
    model: 'm3-test',
    messages: [{ role: 'user', content: [{ type: 'text', text: 'what?' }, { type: 'image_url', image_url: { url } }] }],
  });
  await assert.rejects(ask(`data:image/png;base64,${png.toString('base64')}`),
    (e) => e.status === 400 && e.code === 'vision_not_available');
  await assert.rejects(ask(`data:image/jpeg;base64,${png.toString('base64')}`),
    (e) => e.status === 400 && e.code === 'invalid_image');
  await assert.rejects(ask('http://169.254.169.254/latest/meta-data/'),
    (e) => e.status === 400 && e.code === 'media_domain_not_allowed');
});

test('streamed error event when generation fails', async () => {
  await assert.rejects(async () => {
    const s = await srv.client.chat.completions.create({
      model: 'm3-test', stream: true, messages: [{ role: 'user', content: script('abcdef', { error: true }) }],
    });
    for await (const _ of s) { /* consume */ }
  }, /Generation failed/);
});

test('random outputs: streamed == whole for random chunking', async () => {
  const pieces = ['word ', 'ü', '😀', '\n', '<x>', '"q"', ' 42', ']<]', '</mm:think>'];
  let seed = 7;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  for (let i = 0; i < 12; i++) {
    let out = '';
    for (let k = rnd(8); k > 0; k--) out += pieces[rnd(pieces.length)];
    if (rnd(2)) {
      out += toolBlock(invoke('get_weather', tag('city', pieces[rnd(6)] + 'x') + tag('days', String(rnd(50)))));
    }
    out += pieces[rnd(5)];
    const { whole, streams } = await both({
      model: 'm3-test', tools: weatherTools, thinking: { type: rnd(2) ? 'enabled' : 'adaptive' },
      messages: [{ role: 'user', content: script(out) }],
    }, [1 + rnd(3), 4 + rnd(5)]);
    const msg = whole.choices[0].message;
    for (const s of streams) {
      assert.equal(s.folded.content, msg.content ?? '', `case ${i} tps ${s.tps}: ${JSON.stringify(out)}`);
      assert.equal(s.folded.reasoning, msg.reasoning_content ?? '');
      assert.deepEqual(s.folded.toolCalls.map((c) => [c.name, c.arguments]),
        (msg.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]));
    }
  }
});
