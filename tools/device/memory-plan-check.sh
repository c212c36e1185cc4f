#!/usr/bin/env bash
# Checks the GPU memory plan on the GPU machine (through the device tool; needs .device/cuda from
# tools/device/bundle.sh, carry [".device/cuda.tar.xz"]). Builds nothing.
#
# `m3serve serve --device cuda --mem-fraction-static F` loads the weights, runs a profile step of
# the largest prefill chunk, and sizes the KV pool from the memory the step left (docs/memory.md).
# This script serves a model with the real MiniMax-M3.1-Flash layer shapes (LAYERS layers: 3
# dense, the rest MoE; m3-tiny's tokenizer, vocabulary 4096; --load-format dummy), then runs
# prompts of a whole chunk and a burst of concurrent decodes while sampling the device's memory
# every 0.2 s, and checks that:
#   - the server starts and every request completes;
#   - the peak memory in use stays below the device's total;
#   - what serving used beyond the weights and the KV pool stays within the measured working
#     memory (+3 %): the profile step saw the real peak.
# Files back in $OUT: memory-plan.log (everything), server.log, memory.csv.
# Environment: LAYERS (8), FRACTION (0.85), CHUNK (32768), M3SERVE (.device/cuda/m3serve).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
. tools/device/health.sh
LOG=$OUT/memory-plan.log
LAYERS=${LAYERS:-8}
FRACTION=${FRACTION:-0.85}
CHUNK=${CHUNK:-32768}
BIN=${M3SERVE:-$B/m3serve}
M=$(mktemp -d)
cp models/m3-tiny/{tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} "$M/"
python3 - "$M/config.json" "$LAYERS" <<'EOF'
import json, sys
c = json.load(open("models/m3-tiny/config.json"))
n = int(sys.argv[2])
t = c["text_config"]
t.update(hidden_size=6144, intermediate_size=3072, dense_intermediate_size=12288,
         shared_intermediate_size=3072, num_hidden_layers=n, num_attention_heads=64,
         num_key_value_heads=4, head_dim=128, rotary_dim=64, num_local_experts=128,
         num_experts_per_tok=4, moe_layer_freq=[0] * 3 + [1] * (n - 3),
         max_position_embeddings=131072)
s = t["sparse_attention_config"]
s.update(sparse_num_index_heads=4, sparse_index_dim=128, sparse_block_size=128,
         sparse_topk_blocks=16, sparse_attention_freq=[1] * n, sparse_disable_index_value=[1] * n)
json.dump(c, open(sys.argv[1], "w"), indent=2)
EOF
nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits \
  -lms 200 >"$OUT/memory.csv" 2>&1 &
SMI=$!
PORT=30178
"$BIN" serve --model-path "$M" --load-format dummy --device cuda --port "$PORT" \
  --mem-fraction-static "$FRACTION" --chunked-prefill-size "$CHUNK" --max-running-requests 64 \
  --context-length 131072 >"$OUT/server.log" 2>&1 &
SERVER=$!
rc=0
ready=no
for _ in $(seq 1 600); do
  health_ok "$PORT" && { ready=yes; break; }
  kill -0 "$SERVER" 2>/dev/null || break
  sleep 0.5
done
{
  echo "== $(date -u +%FT%TZ) $(hostname) layers $LAYERS fraction $FRACTION chunk $CHUNK"
  cat "$B/BUILD_INFO" 2>/dev/null
  grep -E "memory profile|KV cache|ready" "$OUT/server.log"
  echo "ready: $ready"
} >>"$LOG"
[ "$ready" = yes ] || rc=1
if [ "$ready" = yes ]; then
  for spec in "2 2 $((CHUNK - 512)) 16" "64 64 512 64"; do
    read -r n c in out <<<"$spec"
    echo "== bench $n prompts of $in tokens, $out out, concurrency $c" >>"$LOG"
    timeout 240 "$BIN" bench --port "$PORT" --dataset fixed --num-prompts "$n" \
      --random-input-len "$in" --random-output-len "$out" --max-concurrency "$c" \
      --disable-progress >>"$LOG" 2>&1 || rc=1
  done
fi
kill "$SERVER" 2>/dev/null
wait "$SERVER" 2>/dev/null
kill "$SMI" 2>/dev/null
# Bytes from the server's lines; MiB from nvidia-smi.
read -r total weights working <<<"$(sed -n 's/.*memory profile: \([0-9]*\) bytes in all, \([0-9]*\) of weights, \([0-9]*\) working.*/\1 \2 \3/p' "$OUT/server.log" | head -1)"
kv=$(sed -n 's/^m3serve: KV cache \([0-9]*\) bytes.*/\1/p' "$OUT/server.log" | head -1)
peak=$(awk -F', ' '{ if ($2 + 0 > m) m = $2 + 0 } END { print m + 0 }' "$OUT/memory.csv")
smi_total=$(awk -F', ' 'NR == 1 { print $3 + 0 }' "$OUT/memory.csv")
# nvidia-smi's used memory counts the driver's reservation, which the CUDA runtime's total (the
# server's figures) leaves out: subtracted from the peak where this nvidia-smi reports it.
reserved=$(nvidia-smi --query-gpu=memory.reserved --format=csv,noheader,nounits 2>/dev/null |
  head -1 | tr -dc 0-9)
python3 - "${total:-0}" "${weights:-0}" "${working:-0}" "${kv:-0}" "$peak" "${smi_total:-0}" \
  "$rc" "${reserved:-0}" <<'EOF' | tee -a "$LOG"
import sys
total, weights, working, kv, peak_mib, smi_total_mib, rc, reserved_mib = map(int, sys.argv[1:])
mib = 1 << 20
peak = (peak_mib - reserved_mib) * mib
print(f"nvidia-smi: driver reservation {reserved_mib} MiB, not counted")
beyond = peak - weights - kv
ok = rc == 0 and total > 0 and peak_mib <= smi_total_mib and beyond <= working * 1.03
print(f"device total {total / 2**30:.2f} GiB (nvidia-smi {smi_total_mib} MiB)")
print(f"weights {weights / 2**30:.2f} GiB, KV pool {kv / 2**30:.2f} GiB, "
      f"working measured {working / 2**30:.2f} GiB")
print(f"peak in use while serving {peak_mib} MiB = weights + KV + {beyond / 2**30:.2f} GiB")
print("memory plan check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
rc=$?
echo "memory-plan-check rc=$rc"
exit $rc
