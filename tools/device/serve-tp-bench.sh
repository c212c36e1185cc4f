#!/usr/bin/env bash
# `m3serve serve --device cuda --tp N` with the whole MiniMax-M3.1-Flash (built-in config, all 60
# layers, `--load-format dummy`: weights generated on the GPUs in the real formats), measured with
# `m3serve bench` as InferenceX measures: random 1024-in/1024-out and 8192-in/1024-out prompts
# (fixed lengths, ignore_eos), concurrency 1, 4, 16 and 64. Also the cold start (launch to
# /health 200). Runs on the GPU machine through the device tool (needs .device/cuda from
# tools/device/bundle.sh, carry [".device/cuda.tar.xz"]); builds nothing.
# Files back in $OUT: serve-tp-bench.log (everything), server.log, bench-*.json.
# Environment: TP (default: every GPU), EXTRA (more serve flags, e.g. --disable-custom-all-reduce),
# CONCURRENCY ("1 4 16 64"), WORKLOADS ("1024:1024 8192:1024"), PROMPTS_PER_CONC (4), LAYERS (60;
# fewer, e.g. 8, fit one GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
. tools/device/health.sh
LOG=$OUT/serve-tp-bench.log
GPUS=$(nvidia-smi -L | wc -l)
TP=${TP:-$GPUS}
PORT=30188
M=$(mktemp -d)
tools/device/flash-config.sh "$M" "${LAYERS:-60}"
t0=$(date +%s.%N)
"$B/m3serve" serve --model-path "$M" --load-format dummy --device cuda --tp "$TP" --port "$PORT" \
  ${EXTRA:-} >"$OUT/server.log" 2>&1 &
SERVER=$!
ready=no
for _ in $(seq 1 1200); do
  if health_ok "$PORT"; then ready=yes; break; fi
  kill -0 "$SERVER" 2>/dev/null || break
  sleep 0.25
done
cold=$(echo "$(date +%s.%N) - $t0" | bc)
{
  echo "== $(date -u +%FT%TZ) $(hostname), $GPUS GPUs, --tp $TP ${EXTRA:-}"
  cat "$B/BUILD_INFO" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total --format=csv
  echo "cold start to /health 200: ${cold} s (ready=$ready)"
  grep -E "^m3serve: (KV cache|--tp|memory profile|warning)" "$OUT/server.log"
} >>"$LOG" 2>&1
rc=0
if [ "$ready" = yes ]; then
  for w in ${WORKLOADS:-1024:1024 8192:1024}; do
    in=${w%%:*} out=${w##*:}
    for c in ${CONCURRENCY:-1 4 16 64}; do
      echo "== bench in $in out $out concurrency $c" >>"$LOG"
      timeout 540 "$B/m3serve" bench --port "$PORT" --dataset fixed \
        --num-prompts $((c * ${PROMPTS_PER_CONC:-4})) --random-input-len "$in" \
        --random-output-len "$out" --max-concurrency "$c" --disable-progress \
        --output-file "$OUT/bench-$in-$out-c$c.json" >>"$LOG" 2>&1
      r=$?
      echo "bench rc=$r" >>"$LOG"
      [ "$r" = 0 ] || rc=1
    done
  done
else
  rc=1
  tail -20 "$OUT/server.log" >>"$LOG"
fi
kill "$SERVER" 2>/dev/null
wait "$SERVER" 2>/dev/null
echo "serve-tp-bench rc=$rc" >>"$LOG"
cat "$LOG"
exit "$rc"
