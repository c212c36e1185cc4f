// The vision checkpoint format that tools/train_tiny trains (train.py --vision) loads and runs in
// `m3serve serve`: tools/train_tiny/make_vision_check_model.py writes m3-tiny plus a randomly
// initialised tower in exactly that format (config.json's vision_config, preprocessor_config.json,
// bf16 tensors named as the C++ loader reads them); the server must report the tower, expand each
// image of tools/train_tiny/eval_vision.jsonl to 16 image tokens plus start and end, and feed the
// tower's features to the model (two different images change the next-token distribution).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { repoRoot, startServer, stopServer } from '../e2e/helpers.mjs';

let srv;
let dir;
const evalItems = fs.readFileSync(path.join(repoRoot, 'tools/train_tiny/eval_vision.jsonl'), 'utf8')
  .split('\n').filter(Boolean).map((l) => JSON.parse(l));
const imageUrl = (i) => evalItems[i].messages.at(-1).content[0].image_url.url;

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'm3tiny-vision-'));
  const model = path.join(dir, 'model');
  execFileSync('python3', [path.join(repoRoot, 'tools/train_tiny/make_vision_check_model.py'), model]);
  srv = await startServer(['--model-path', model, '--served-model-name', 'm3-tiny-vision']);
});

after(async () => {
  assert.equal(await stopServer(srv), 0, srv?.log());
  fs.rmSync(dir, { recursive: true, force: true });
});

async function ask(content) {
  return srv.client.chat.completions.create({
    model: 'm3-tiny-vision', temperature: 0, max_tokens: 3, logprobs: true, top_logprobs: 3,
    messages: [{ role: 'user', content }],
  });
}

test('the tower of the trained format is loaded', () => {
  assert.match(srv.log(), /vision: 4-layer tower \(hidden 128\) on the CPU in float32; images of 3136\.\.12544 pixels/);
});

test('an eval image adds 16 image tokens plus start and end, and its features reach the model', async () => {
  const question = 'What is in the picture?';
  const textOnly = await ask([{ type: 'text', text: question }]);
  const a = await ask([{ type: 'image_url', image_url: { url: imageUrl(0) } }, { type: 'text', text: question }]);
  const b = await ask([{ type: 'image_url', image_url: { url: imageUrl(1) } }, { type: 'text', text: question }]);
  assert.equal(a.usage.prompt_tokens, textOnly.usage.prompt_tokens + 18);
  assert.equal(b.usage.prompt_tokens, textOnly.usage.prompt_tokens + 18);
  // Different pictures, different features: the first token's distribution changes.
  const first = (r) => r.choices[0].logprobs.content[0].top_logprobs.map((t) => t.logprob);
  const diff = Math.max(...first(a).map((v, k) => Math.abs(v - first(b)[k])));
  assert.ok(diff > 1e-4, `first-token logprobs of two images differ by only ${diff}`);
});

test('the same eval set in the eval script format is served (held-out phrasing, thinking modes)', async () => {
  for (const it of evalItems.slice(0, 3)) {
    const r = await srv.client.chat.completions.create({
      model: 'm3-tiny-vision', temperature: 0, max_tokens: 4, messages: it.messages,
      ...(it.kwargs.thinking_mode ? { chat_template_kwargs: { thinking_mode: it.kwargs.thinking_mode } } : {}),
    });
    assert.equal(r.choices.length, 1);
    assert.ok(r.usage.prompt_tokens > 18, JSON.stringify(r.usage));
  }
});
