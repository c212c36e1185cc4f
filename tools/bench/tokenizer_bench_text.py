#!/usr/bin/env python3
"""The tokenizer benchmark text: a few MB of mixed documents built from the golden corpus.

Deterministic (seeded), so that the HF timing on the GPU machine (tools/reference/
tokenizer_golden.py) and our bench (tools/bench/tokenizer_bench) encode the same bytes.
usage: tools/bench/tokenizer_bench_text.py [CORPUS] [OUT] [MB]
  CORPUS default tests/fixtures/tokenizer/corpus.jsonl; OUT default build-tok/tokenizer_bench.jsonl
  (one JSON string per line, one document each); MB default 4.
"""
import json
import random
import sys


def corpus_texts(corpus_path):
    texts = []
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if "text" in rec and rec["text"]:
                texts.append(rec["text"])
    return texts


def make_docs(corpus_path, target_bytes=4 << 20, seed=12345):
    texts = corpus_texts(corpus_path)
    rng = random.Random(seed)
    docs, total = [], 0
    while total < target_bytes:
        doc = "\n".join(rng.choice(texts) for _ in range(rng.randint(5, 40)))
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    return docs


def main():
    corpus = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizer/corpus.jsonl"
    out = sys.argv[2] if len(sys.argv) > 2 else "build-tok/tokenizer_bench.jsonl"
    mb = float(sys.argv[3]) if len(sys.argv) > 3 else 4.0
    docs = make_docs(corpus, int(mb * (1 << 20)))
    with open(out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"wrote {len(docs)} documents, {sum(len(d.encode()) for d in docs)} bytes to {out}")


if __name__ == "__main__":
    main()
