#!/usr/bin/env node
// Held-out evaluation of m3-tiny (or any MiniMax-M3-format model) on tools/train_tiny/eval_set.jsonl:
// arithmetic answers ("What is A op B?", the last number of the answer must be right) and tool calls
// (the output must contain a ]<]minimax[>[<tool_call> block that parses, names the right tool and has
// the right argument values). None of the values in the set were used in training.
//
// Backends:
//   --backend server --url http://127.0.0.1:8000/v1   OpenAI chat completions (temperature 0); uses the
//       server's parsed tool_calls / reasoning_content when present, else parses the raw content.
//   --backend cli --bin build/bin/m3serve [--model-path models/m3-tiny]
//       runs `m3serve generate --prompt-ids ... --temperature 0 --output-format json` per item with the
//       prompt ids computed by the training run (tests/fixtures/m3_tiny/eval_prompt_ids.json) and decodes
//       the output ids with the model's tokenizer.json.
//   --backend file --completions FILE.jsonl            scores lines {"id": ..., "text": ...} (raw
//       completion text after the generation prompt, special tokens kept).
// Sets: --set FILE[,FILE...] (default eval_set.jsonl). The vision-and-tools round adds
//   eval_tools_heldout.jsonl   tasks gtool (held-out tool schemas: right tool, right argument names and
//                              values) and gtool_none (no offered tool fits: a plain answer, no call);
//   eval_tools_natural.jsonl   tasks ntool / ntool_none: the same scoring on hand-written requests as a new
//                              user would make them (make_natural_tool_set.py);
//   eval_vision.jsonl          task vision (held-out images as PNG data URLs, held-out phrasings: the answer
//                              names the right colour / shape / corner / count and no other); server only.
// Options: --limit N (first N of each task), --out results.json, --concurrency K, --max-tokens N,
//   --temperature T (server backend; default 0: the accuracies are greedy ones).
// Prints a summary table and exits non-zero when an accuracy is below --min (default 0.9).
import fs from "node:fs";
import path from "node:path";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "../..");
const NS = "]<]minimax[>[";

function parseArgs(argv) {
  const a = { backend: "server", url: "http://127.0.0.1:8000/v1", model: "m3-tiny", limit: 0,
              modelPath: path.join(ROOT, "models/m3-tiny"), bin: path.join(ROOT, "build/bin/m3serve"),
              ids: path.join(ROOT, "tests/fixtures/m3_tiny/eval_prompt_ids.json"),
              set: path.join(HERE, "eval_set.jsonl"), concurrency: 2, maxTokens: 256, min: 0.9,
              temperature: 0 };
  for (let i = 2; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, "").replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    const v = argv[++i];
    a[k] = ["limit", "concurrency", "maxTokens", "min", "temperature"].includes(k) ? Number(v) : v;
  }
  return a;
}

// ---------------------------------------------------------------- output parsing (mirrors corpus.py)
export function splitReasoning(text, mode) {
  text = text.replaceAll("[e~[", "");
  if (mode === "enabled") {
    const i = text.indexOf("</mm:think>");
    return i >= 0 ? [text.slice(0, i), text.slice(i + 11)] : [text, ""];
  }
  if (text.startsWith("</mm:think>")) return ["", text.slice(11)];
  if (mode !== "disabled" && text.startsWith("<mm:think>")) {
    const i = text.indexOf("</mm:think>");
    if (i >= 0) return [text.slice(10, i), text.slice(i + 11)];
  }
  return ["", text];
}

const TAG = new RegExp(NS.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "<(/?)([^<>]+?)>", "g");

function parseChildren(text, pos, closing) {
  const children = [];
  let bufStart = pos;
  for (;;) {
    TAG.lastIndex = pos;
    const m = TAG.exec(text);
    if (!m) throw new Error(`unterminated <${closing}>`);
    if (m[1] === "/") {
      if (m[2] !== closing) throw new Error(`mismatched </${m[2]}>, expected </${closing}>`);
      if (children.length) {
        if (text.slice(bufStart, m.index).trim()) throw new Error(`mixed text in <${closing}>`);
        return [["elem", children], m.index + m[0].length];
      }
      return [["text", text.slice(bufStart, m.index)], m.index + m[0].length];
    }
    if (text.slice(bufStart, m.index).trim()) throw new Error(`text before <${m[2]}>`);
    const [child, next] = parseChildren(text, m.index + m[0].length, m[2]);
    children.push([m[2], child]);
    pos = bufStart = next;
  }
}

function build(node, schema) {
  const typ = schema?.type;
  const [kind, val] = node;
  if (kind === "text") {
    if (typ === "integer" || typ === "number") {
      if (!/^\s*-?\d+(\.\d+)?([eE][-+]?\d+)?\s*$/.test(val)) throw new Error(`not a number: ${val}`);
      return Number(val);
    }
    if (typ === "boolean") return val.trim() === "true";
    if (typ === "array" || typ === "object") return val.trim() ? JSON.parse(val) : (typ === "array" ? [] : {});
    return val;
  }
  if (typ === "array" || (!typ && val.every(([t]) => t === "item"))) return val.map(([, n]) => build(n, schema?.items));
  const out = {};
  for (const [t, n] of val) out[t] = build(n, schema?.properties?.[t]);
  return out;
}

export function parseToolCalls(content, tools) {
  const start = content.indexOf(NS + "<tool_call>");
  if (start < 0) return [content, []];
  const end = content.indexOf(NS + "</tool_call>", start);
  if (end < 0) throw new Error("no closing </tool_call>");
  const block = content.slice(start + NS.length + 11, end);
  const schemas = Object.fromEntries((tools || []).map((t) => [(t.function || t).name, (t.function || t).parameters]));
  const calls = [];
  const inv = new RegExp(NS.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + '<invoke name="([^"]+)">', "g");
  let m;
  while ((m = inv.exec(block))) {
    const [node] = parseChildren(block, m.index + m[0].length, "invoke");
    const args = node[0] === "text" ? {} : build(node, schemas[m[1]] || { type: "object" });
    calls.push({ name: m[1], arguments: args });
  }
  if (!calls.length) throw new Error("tool_call block without invoke");
  return [content.slice(0, start), calls];
}

function lastNumber(text) {
  const all = text.match(/-?\d+(?:\.\d+)?/g);
  return all ? all[all.length - 1] : null;
}

function deepEqual(a, b) {
  return JSON.stringify(sortKeys(a)) === JSON.stringify(sortKeys(b));
}
function sortKeys(x) {
  if (Array.isArray(x)) return x.map(sortKeys);
  if (x && typeof x === "object") return Object.fromEntries(Object.keys(x).sort().map((k) => [k, sortKeys(x[k])]));
  return x;
}

const SHAPE_POOLS = {
  colour: ["red", "green", "blue", "yellow", "purple", "orange"],
  shape: ["circle", "square", "triangle", "diamond"],
  position: ["top left", "top right", "bottom left", "bottom right"],
};

// Mirrors shapes.score: the expected value named, and no competing one.
export function scoreVision(kind, want, content) {
  const text = content.toLowerCase().replaceAll("color", "colour");
  if (kind === "count") {
    const nums = text.match(/\d+/g);
    return !!nums && nums[nums.length - 1] === want;
  }
  const found = SHAPE_POOLS[kind].filter((p) => new RegExp(`\\b${p}\\b`).test(text));
  return found.length === 1 && found[0] === want;
}

// result: {content, reasoning, toolCalls?} ; toolCalls from a server are [{name, arguments(object)}]
export function score(item, result) {
  if (item.task === "vision") {
    const ok = scoreVision(item.expect.kind, item.expect.answer, result.content || "");
    return { ok, got: (result.content || "").trim().slice(-120), want: item.expect.answer };
  }
  if (item.task === "gtool_none" || item.task === "ntool_none") {
    let calls = result.toolCalls || [];
    if (!calls.length) {
      try { calls = parseToolCalls(result.content || "", item.tools)[1]; } catch (e) { return { ok: false, error: String(e.message || e) }; }
    }
    return { ok: !calls.length && !!(result.content || "").trim(), got: calls.map((c) => c.name), want: "no call" };
  }
  if (item.task === "arith" || item.task === "arith_nothink") {
    const got = lastNumber(result.content || "");
    return { ok: got === String(item.expect.value), got, want: item.expect.value };
  }
  let calls = result.toolCalls;
  let via = "server";
  if (!calls || !calls.length) {
    via = "text";
    try {
      calls = parseToolCalls(result.content || "", item.tools)[1];
    } catch (e) {
      return { ok: false, error: String(e.message || e), via };
    }
  }
  if (!calls.length) return { ok: false, error: "no tool call", via };
  const c = calls[0];
  const ok = c.name === item.expect.name && deepEqual(c.arguments, item.expect.arguments);
  return { ok, got: [c.name, c.arguments], want: [item.expect.name, item.expect.arguments], via };
}

// ---------------------------------------------------------------- backends
async function runServer(item, a) {
  const body = { model: a.model, messages: item.messages, temperature: a.temperature, max_tokens: a.maxTokens };
  if (item.tools) body.tools = item.tools;
  if (item.kwargs.thinking_mode) {
    body.thinking = { type: item.kwargs.thinking_mode };
    body.chat_template_kwargs = { thinking_mode: item.kwargs.thinking_mode };
  }
  const r = await fetch(a.url.replace(/\/$/, "") + "/chat/completions", {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const j = await r.json();
  const msg = j.choices[0].message;
  const toolCalls = (msg.tool_calls || []).map((t) => ({
    name: t.function.name,
    arguments: typeof t.function.arguments === "string" ? JSON.parse(t.function.arguments) : t.function.arguments,
  }));
  let content = msg.content || "";
  let reasoning = msg.reasoning_content || msg.reasoning || "";
  if (!reasoning && /<\/?mm:think>/.test(content)) [reasoning, content] = splitReasoning(content, item.mode);
  return { content, reasoning, toolCalls, raw: msg };
}

function byteDecoder() {
  // GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to 256 + n.
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  return new Map(cs.map((c, i) => [String.fromCodePoint(c), bs[i]]));
}

function makeDecoder(modelPath) {
  const tj = JSON.parse(fs.readFileSync(path.join(modelPath, "tokenizer.json"), "utf8"));
  const idToTok = new Map();
  for (const [t, id] of Object.entries(tj.model.vocab)) idToTok.set(id, t);
  const added = new Map(tj.added_tokens.map((t) => [t.id, t.content]));
  const bd = byteDecoder();
  return (ids) => {
    let out = "";
    let bytes = [];
    const flush = () => { out += Buffer.from(bytes).toString("utf8"); bytes = []; };
    for (const id of ids) {
      if (added.has(id)) { flush(); out += added.get(id); continue; }
      for (const ch of idToTok.get(id) ?? "") bytes.push(bd.get(ch));
    }
    flush();
    return out;
  };
}

function findIds(j) {
  for (const k of ["output_ids", "generated_ids", "token_ids", "tokens", "ids"]) {
    if (Array.isArray(j?.[k]) && j[k].every((x) => Number.isInteger(x))) return j[k];
  }
  for (const v of Object.values(j || {})) if (v && typeof v === "object") { const r = findIds(v); if (r) return r; }
  return null;
}

function runCli(item, a, promptIds, decode) {
  const ids = promptIds[item.id];
  if (!ids) throw new Error(`no prompt ids for ${item.id} in ${a.ids}`);
  const argv = ["generate", "--model-path", a.modelPath, "--prompt-ids", ids.join(","),
                "--max-tokens", String(a.maxTokens), "--temperature", "0", "--output-format", "json"];
  return new Promise((resolve, reject) => {
    execFile(a.bin, argv, { maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
      if (err) return reject(new Error(`${a.bin} failed: ${stderr || err.message}`));
      let j;
      try { j = JSON.parse(stdout); } catch { return reject(new Error(`not JSON: ${stdout.slice(0, 200)}`)); }
      const out = findIds(j);
      const text = out ? decode(out) : (j.text ?? j.output_text ?? "");
      const [reasoning, content] = splitReasoning(text, item.mode);
      resolve({ content, reasoning, raw: text });
    });
  });
}

async function pool(items, k, fn) {
  const res = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: Math.max(1, k) }, async () => {
    while (next < items.length) { const i = next++; res[i] = await fn(items[i], i); }
  }));
  return res;
}

async function main() {
  const a = parseArgs(process.argv);
  let items = String(a.set).split(",").flatMap((f) =>
    fs.readFileSync(path.isAbsolute(f) || fs.existsSync(f) ? f : path.join(HERE, f), "utf8")
      .split("\n").filter(Boolean).map((l) => JSON.parse(l)));
  if (a.limit) {
    const per = {};
    items = items.filter((it) => (per[it.task] = (per[it.task] || 0) + 1) <= a.limit);
  }
  let run;
  if (a.backend === "server") run = (it) => runServer(it, a);
  else if (a.backend === "cli") {
    const promptIds = JSON.parse(fs.readFileSync(a.ids, "utf8"));
    const decode = makeDecoder(a.modelPath);
    run = (it) => runCli(it, a, promptIds, decode);
  } else if (a.backend === "file") {
    const comp = new Map(fs.readFileSync(a.completions, "utf8").split("\n").filter(Boolean)
      .map((l) => JSON.parse(l)).map((j) => [j.id, j.text]));
    run = async (it) => {
      if (!comp.has(it.id)) throw new Error(`no completion for ${it.id}`);
      const [reasoning, content] = splitReasoning(comp.get(it.id), it.mode);
      return { content, reasoning, raw: comp.get(it.id) };
    };
  } else throw new Error(`unknown backend ${a.backend}`);

  const t0 = Date.now();
  const rows = await pool(items, a.concurrency, async (it) => {
    try {
      const r = await run(it);
      return { id: it.id, task: it.task, mode: it.mode, ...score(it, r), output: r.raw ?? r.content };
    } catch (e) {
      return { id: it.id, task: it.task, mode: it.mode, ok: false, error: String(e.message || e) };
    }
  });
  const summary = {};
  let fail = false;
  for (const task of ["arith", "arith_nothink", "tool", "gtool", "gtool_none", "ntool", "ntool_none", "vision"]) {
    const r = rows.filter((x) => x.task === task);
    if (!r.length) continue;
    const s = { n: r.length, correct: r.filter((x) => x.ok).length };
    for (const m of ["adaptive", "enabled", "disabled"]) {
      const rm = r.filter((x) => x.mode === m);
      s[m] = `${rm.filter((x) => x.ok).length}/${rm.length}`;
    }
    s.accuracy = s.n ? s.correct / s.n : 0;
    if (task === "tool" || task === "gtool") s.parsed_from_text = r.filter((x) => x.via === "text").length;
    summary[task] = s;
    if (s.n && task !== "arith_nothink" && s.accuracy < a.min) fail = true;
  }
  for (const x of rows.filter((x) => !x.ok).slice(0, 10)) console.log("FAIL", x.id, x.mode, JSON.stringify(x.error ?? x.got), "|", (typeof x.output === "string" ? x.output : JSON.stringify(x.output ?? "")).slice(-200));
  console.log(`backend ${a.backend}, ${rows.length} items, ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  console.log("task           accuracy          adaptive  enabled  disabled");
  for (const [t, s] of Object.entries(summary)) {
    console.log(`${t.padEnd(14)} ${(100 * s.accuracy).toFixed(1).padStart(5)}% (${s.correct}/${s.n})`.padEnd(33) +
      `${s.adaptive.padEnd(10)}${s.enabled.padEnd(9)}${s.disabled}`);
  }
  if (a.out) fs.writeFileSync(a.out, JSON.stringify({ summary, rows }, null, 1) + "\n");
  process.exit(fail ? 1 : 0);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
