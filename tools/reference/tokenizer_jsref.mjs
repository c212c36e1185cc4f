// A second, local reference for the tokenizer tests: @lenml/tokenizers (a port of
// transformers.js) on the golden corpus. It differs from HF (Rust) on some inputs, so it is only
// used to find our own bugs early; the committed goldens come from tokenizer_golden.py.
//   node tools/reference/tokenizer_jsref.mjs OUT_DIR [CORPUS]
// writes OUT_DIR/<name>.jsonl with {"id", "ids", "ids_special", "decode", "decode_skip"}, the
// same fields the golden files have (run the golden test with M3_TOKENIZER_GOLDEN_DIR=OUT_DIR).
import fs from "node:fs";
import path from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";

const outDir = process.argv[2];
const corpus = process.argv[3] ?? "tests/fixtures/tokenizer/corpus.jsonl";
if (!outDir) {
  console.error("usage: node tools/reference/tokenizer_jsref.mjs OUT_DIR [CORPUS]");
  process.exit(2);
}
fs.mkdirSync(outDir, { recursive: true });

const lines = fs
  .readFileSync(corpus, "utf8")
  .split("\n")
  .filter((l) => l.length > 0)
  .map((l) => {
    const r = JSON.parse(l);
    const text = "text" in r ? r.text : new TextDecoder("utf-8").decode(Buffer.from(r.bytes_hex, "hex"));
    return { id: r.id, text };
  });

for (const name of ["qwen3", "deepseek_v3", "gptoss", "llama3", "gemma3", "llama2"]) {
  const dir = `node_modules/@lenml/tokenizer-${name}/models`;
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  // Decode exactly what the tokenizer gives, like HF tokenizers' decode.
  tokenizerConfig.clean_up_tokenization_spaces = false;
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const out = [];
  for (const { id, text } of lines) {
    const rec = { id };
    try {
      rec.ids = tok.encode(text, { add_special_tokens: false });
      rec.ids_special = tok.encode(text, { add_special_tokens: true });
      rec.decode = tok.decode(rec.ids, { skip_special_tokens: false });
      rec.decode_skip = tok.decode(rec.ids, { skip_special_tokens: true });
    } catch (e) {
      rec.error_ids = String(e);
    }
    out.push(JSON.stringify(rec));
  }
  fs.writeFileSync(path.join(outDir, `${name}.jsonl`), out.join("\n") + "\n");
  console.log(`${name}: ${out.length} lines`);
}
