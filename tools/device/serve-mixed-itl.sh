#!/usr/bin/env bash
# Decode streams while long prompts arrive, on one GPU: `m3serve serve --device cuda` on
# MiniMax-M3.1-Flash's shapes with LAYERS layers (`--load-format dummy`; the whole model does not
# fit one GPU, and the stall a prefill causes per layer is the same at any depth), then
# `m3serve bench --dataset mixed`: STREAMS streams of 128-token prompts generating long answers,
# and after 3 s, PROMPTS prompts of PROMPT_LEN tokens arriving at 0.5/s. The bench reports the
# streams' ITL apart for gaps with and without a long prompt in flight, and the p99 ratio.
# Once per --chunked-prefill-size in CHUNKS. Runs on the GPU machine through the device tool
# (needs .device/cuda from tools/device/bundle.sh, carry [".device/cuda.tar.xz"]); builds nothing.
# Files back in $OUT: serve-mixed-itl.log, server-*.log, mixed-*.json.
# Environment: LAYERS (8), STREAMS (8), PROMPTS (4), PROMPT_LEN (8192), OUTPUT_LEN (3000),
# CHUNKS ("8192 2048"), EXTRA (more serve flags).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
. tools/device/health.sh
LOG=$OUT/serve-mixed-itl.log
PORT=30189
M=$(mktemp -d)
tools/device/flash-config.sh "$M" "${LAYERS:-8}"
{
  echo "== $(date -u +%FT%TZ) $(hostname), layers ${LAYERS:-8}"
  cat "$B/BUILD_INFO" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total --format=csv
} >>"$LOG" 2>&1
rc=0
for chunk in ${CHUNKS:-8192 2048}; do
  "$B/m3serve" serve --model-path "$M" --load-format dummy --device cuda --port "$PORT" \
    --chunked-prefill-size "$chunk" ${EXTRA:-} >"$OUT/server-$chunk.log" 2>&1 &
  SERVER=$!
  ready=no
  for _ in $(seq 1 1200); do
    if health_ok "$PORT"; then ready=yes; break; fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.25
  done
  echo "== --chunked-prefill-size $chunk (ready=$ready)" >>"$LOG"
  if [ "$ready" = yes ]; then
    timeout 240 "$B/m3serve" bench --port "$PORT" --dataset mixed \
      --mixed-streams "${STREAMS:-8}" --random-input-len 128 \
      --random-output-len "${OUTPUT_LEN:-3000}" --mixed-prompt-len "${PROMPT_LEN:-8192}" \
      --mixed-prompt-output-len 16 --num-prompts "${PROMPTS:-4}" --request-rate 0.5 \
      --mixed-delay 3 --random-vocab-size 4032 --disable-progress \
      --output-file "$OUT/mixed-$chunk.json" >>"$LOG" 2>&1
    r=$?
    echo "bench rc=$r" >>"$LOG"
    [ "$r" = 0 ] || rc=1
  else
    rc=1
    tail -20 "$OUT/server-$chunk.log" >>"$LOG"
  fi
  kill "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
done
echo "serve-mixed-itl rc=$rc" >>"$LOG"
cat "$LOG"
exit "$rc"
