#!/usr/bin/env bash
# Runs on the GPU machine (transformers 5.x + jinja2 installed, no network). Renders every request
# in tests/fixtures/chat/requests with every model folder in INPUTS (made locally by
# tools/reference/chat_golden_inputs.sh and carried along) through transformers'
# apply_chat_template, renders the engine cases (tests/fixtures/chat/jinja_cases.json) in
# transformers' own Jinja environment, and writes $OUT/golden.jsonl, $OUT/jinja_expected.jsonl
# and $OUT/chat_golden.tar.gz (both files under tests/fixtures/chat/, to unpack at the repository
# root). Takes a few seconds. See tools/reference/chat_golden.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
inputs=${1:-build-chat/golden-inputs}
out=${OUT:?OUT must name the output folder}
python3 -c "import transformers, jinja2; print('transformers', transformers.__version__, 'jinja2', jinja2.__version__)"
stage=$(mktemp -d)
mkdir -p "$stage/tests/fixtures/chat"
python3 tools/reference/chat_golden.py --engine transformers --models "$inputs" \
  --requests tests/fixtures/chat/requests --out "$stage/tests/fixtures/chat/golden.jsonl"
python3 tools/reference/jinja_cases.py --engine transformers \
  --cases tests/fixtures/chat/jinja_cases.json --out "$stage/tests/fixtures/chat/jinja_expected.jsonl"
cp "$stage/tests/fixtures/chat/golden.jsonl" "$stage/tests/fixtures/chat/jinja_expected.jsonl" "$out/"
tar -C "$stage" -czf "$out/chat_golden.tar.gz" tests/fixtures/chat/golden.jsonl \
  tests/fixtures/chat/jinja_expected.jsonl
echo "wrote $out/golden.jsonl, $out/jinja_expected.jsonl and $out/chat_golden.tar.gz"
