// What the bundled m3-tiny was trained to do beyond text (tools/train_tiny/README.md, the
// vision-and-tools round), asked through `m3serve serve` with the official client as a user would:
// questions about held-out images (tools/train_tiny/eval_vision.jsonl: PNG data URLs, phrasings
// never trained on), calls of tools whose schemas it has never seen
// (tools/train_tiny/eval_tools_heldout.jsonl, with the cases where no offered tool fits) and of
// everyday tools asked for as a new user would (tools/train_tiny/eval_tools_natural.jsonl), scored
// by the evaluation script's own rules (tools/train_tiny/eval.mjs). Greedy on the float32 CPU
// path; the floors sit below what the shipped model scores on these items (37 / 40 images, 37 / 48
// tool requests, 10 / 28 everyday requests) so that a model or server change that costs the skill
// fails here.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { MODEL, repoRoot, startServer, stopServer } from '../e2e/helpers.mjs';
import { score } from '../../../tools/train_tiny/eval.mjs';

const IMAGES = 40;
const IMAGE_FLOOR = 34;
const TOOL_REQUESTS = 48;
const TOOL_FLOOR = 36;
const NATURAL_FLOOR = 9;

let srv;
const read = (name) => fs.readFileSync(path.join(repoRoot, 'tools/train_tiny', name), 'utf8')
  .split('\n').filter(Boolean).map((l) => JSON.parse(l));

before(async () => {
  srv = await startServer([]);
});

after(async () => {
  assert.equal(await stopServer(srv), 0, srv?.log());
});

// One held-out item as eval.mjs's server backend asks it: its messages, tools and thinking mode.
async function ask(item) {
  const body = { model: MODEL, temperature: 0, max_tokens: 256, messages: item.messages };
  if (item.tools) body.tools = item.tools;
  if (item.kwargs?.thinking_mode) {
    body.thinking = { type: item.kwargs.thinking_mode };
    body.chat_template_kwargs = { thinking_mode: item.kwargs.thinking_mode };
  }
  const r = await srv.client.chat.completions.create(body);
  const msg = r.choices[0].message;
  const toolCalls = (msg.tool_calls || []).map((t) => ({
    name: t.function.name, arguments: JSON.parse(t.function.arguments),
  }));
  return { content: msg.content || '', reasoning: msg.reasoning_content || '', toolCalls };
}

async function accuracy(items) {
  const fails = [];
  let ok = 0;
  for (const it of items) {
    const s = score(it, await ask(it));
    if (s.ok) ok += 1;
    else fails.push(`${it.id}: got ${JSON.stringify(s.got ?? s.error)} want ${JSON.stringify(s.want)}`);
  }
  return { ok, fails };
}

test('the startup report names the trained tower', () => {
  assert.match(srv.log(), /vision: 4-layer tower \(hidden 128\)/);
});

test(`held-out images: at least ${IMAGE_FLOOR} of ${IMAGES} questions answered right`, async () => {
  const { ok, fails } = await accuracy(read('eval_vision.jsonl').slice(0, IMAGES));
  console.log(`images: ${ok} / ${IMAGES}`);
  assert.ok(ok >= IMAGE_FLOOR, `${ok} / ${IMAGES} right:\n${fails.join('\n')}`);
});

test(`held-out tool schemas: at least ${TOOL_FLOOR} of ${TOOL_REQUESTS} requests handled right`, async () => {
  const { ok, fails } = await accuracy(read('eval_tools_heldout.jsonl').slice(0, TOOL_REQUESTS));
  console.log(`tool requests: ${ok} / ${TOOL_REQUESTS}`);
  assert.ok(ok >= TOOL_FLOOR, `${ok} / ${TOOL_REQUESTS} right:\n${fails.join('\n')}`);
});

test(`everyday tools asked in a user's words: at least ${NATURAL_FLOOR} requests handled right`, async () => {
  const items = read('eval_tools_natural.jsonl');
  const { ok, fails } = await accuracy(items);
  console.log(`everyday requests: ${ok} / ${items.length}`);
  assert.ok(ok >= NATURAL_FLOOR, `${ok} / ${items.length} right:\n${fails.join('\n')}`);
});
