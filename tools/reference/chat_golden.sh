#!/usr/bin/env bash
# Runs on the GPU machine (transformers 5.x + jinja2 installed, no network). Renders every request
# in tests/fixtures/chat/requests with every model folder in INPUTS (made locally by
# tools/reference/chat_golden_inputs.sh and carried along) through transformers'
# apply_chat_template, and writes $OUT/golden.jsonl plus $OUT/chat_golden.tar.gz (holding
# tests/fixtures/chat/golden.jsonl, to unpack at the repository root). Takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
inputs=${1:-build-chat/golden-inputs}
out=${OUT:?OUT must name the output folder}
python3 -c "import transformers, jinja2; print('transformers', transformers.__version__, 'jinja2', jinja2.__version__)"
stage=$(mktemp -d)
mkdir -p "$stage/tests/fixtures/chat"
python3 tools/reference/chat_golden.py --engine transformers --models "$inputs" \
  --requests tests/fixtures/chat/requests --out "$stage/tests/fixtures/chat/golden.jsonl"
cp "$stage/tests/fixtures/chat/golden.jsonl" "$out/golden.jsonl"
tar -C "$stage" -czf "$out/chat_golden.tar.gz" tests/fixtures/chat/golden.jsonl
echo "wrote $out/golden.jsonl and $out/chat_golden.tar.gz"
