#!/usr/bin/env node
// Renders tests/fixtures/m3_tiny/template_cases.json with @huggingface/jinja and compares with the
// expected text (rendered by Python jinja2 with Hugging Face's settings). Exit code 1 on a mismatch.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const tpl = new Template(fs.readFileSync(path.join(root, "tools/train_tiny/chat_template.jinja"), "utf8"));
const { cases } = JSON.parse(fs.readFileSync(path.join(root, "tests/fixtures/m3_tiny/template_cases.json"), "utf8"));
let failed = 0;
for (const [i, c] of cases.entries()) {
  const out = tpl.render({ messages: c.messages, tools: c.tools, add_generation_prompt: c.add_generation_prompt, ...c.kwargs });
  if (out !== c.expected) {
    failed++;
    let k = 0;
    while (k < out.length && out[k] === c.expected[k]) k++;
    console.log(`case ${i} differs at ${k}: ${JSON.stringify(out.slice(k, k + 60))} vs ${JSON.stringify(c.expected.slice(k, k + 60))}`);
  }
}
console.log(`${cases.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
