#!/usr/bin/env bash
# `m3serve serve --device cuda` end to end on the real-shape path (CudaM3ModelRunner) on the GPU
# machine (through the device tool; needs .device/cuda from tools/device/bundle.sh, carry
# [".device/cuda.tar.xz"]). Builds nothing.
#
# The model: a small config with the real MiniMax-M3 head shapes (16 query heads per KV head of
# 128, index head 128, page = sparse block = 128 tokens; hidden 2048, 4 layers: 1 dense + 3 MoE
# of 16 experts, top-4, one shared expert), `--load-format dummy` weights generated on the GPU in
# the real formats, and m3-tiny's tokenizer and chat template (vocabulary 4096). The text is
# random; what is checked is the serving path: a chat completion answers 200 with usage, and
# `m3serve bench` completes every request at concurrency 1, 8 and 32 (exit code != 0 otherwise).
# Files back in $OUT: serve-smoke.log (everything), server.log.
# Environment (for a check of the script itself on a machine without a GPU): DEVICE (cuda),
# CONCURRENCY ("1 8 32"), OUTPUT_LEN (128), M3SERVE (.device/cuda/m3serve); SERVE_ARGS: more
# `serve` flags, e.g. "--speculative-algorithm DSPARK" (the GPU DSpark draft with dummy weights
# at the layout default_dspark_config_for derives from this config).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
. tools/device/health.sh
LOG=$OUT/serve-smoke.log
M=$(mktemp -d)
cp models/m3-tiny/{tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} "$M/"
python3 - "$M/config.json" <<'EOF'
import json, sys
c = json.load(open("models/m3-tiny/config.json"))
t = c["text_config"]
t.update(hidden_size=2048, intermediate_size=1024, dense_intermediate_size=4096,
         shared_intermediate_size=1024, num_hidden_layers=4, num_attention_heads=16,
         num_key_value_heads=1, head_dim=128, rotary_dim=64, num_local_experts=16,
         num_experts_per_tok=4, moe_layer_freq=[0, 1, 1, 1], max_position_embeddings=32768)
s = t["sparse_attention_config"]
s.update(sparse_num_index_heads=1, sparse_index_dim=128, sparse_block_size=128,
         sparse_topk_blocks=16, sparse_attention_freq=[1] * 4, sparse_disable_index_value=[1] * 4)
json.dump(c, open(sys.argv[1], "w"), indent=2)
EOF
PORT=30177
BIN=${M3SERVE:-$B/m3serve}
# shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
"$BIN" serve --model-path "$M" --load-format dummy --device "${DEVICE:-cuda}" --port "$PORT" \
  ${SERVE_ARGS:-} >"$OUT/server.log" 2>&1 &
SERVER=$!
rc=0
for _ in $(seq 1 120); do
  health_ok "$PORT" && break
  kill -0 "$SERVER" 2>/dev/null || break
  sleep 0.5
done
{
  echo "== $(date -u +%FT%TZ) $(hostname)"
  cat "$B/BUILD_INFO" 2>/dev/null
  echo "== chat completion"
  code=$(curl -s -o "$M/chat.json" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d '{"model":"'"$M"'","messages":[{"role":"user","content":"What is 2 + 3?"}],"max_tokens":32}')
  echo "HTTP $code"; head -c 600 "$M/chat.json"; echo
  if [ "$code" != 200 ] || ! grep -q '"completion_tokens"' "$M/chat.json"; then rc=1; fi
  for c in ${CONCURRENCY:-1 8 32}; do
    echo "== bench concurrency $c (256 in / ${OUTPUT_LEN:-128} out, fixed lengths, ignore_eos)"
    timeout 120 "$BIN" bench --port "$PORT" --dataset fixed --num-prompts $((c * 4)) \
      --random-input-len 256 --random-output-len "${OUTPUT_LEN:-128}" --max-concurrency "$c" \
      --disable-progress
    r=$?
    echo "bench rc=$r"
    [ "$r" = 0 ] || rc=1
  done
} >>"$LOG" 2>&1
cat "$LOG"
kill "$SERVER" 2>/dev/null
wait "$SERVER" 2>/dev/null
grep -m3 -i "cuda\|real-shape\|error" "$OUT/server.log" | tee -a "$LOG"
echo "serve-smoke rc=$rc" | tee -a "$LOG"
exit "$rc"
