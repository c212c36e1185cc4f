#!/usr/bin/env bash
# `m3serve serve --device cuda --tp N` with the whole MiniMax-M3.1-Flash (built-in config, all 60
# layers, `--load-format dummy`: weights generated on the GPUs in the real formats), measured with
# `m3serve bench` as InferenceX measures: random 1024-in/1024-out and 8192-in/1024-out prompts
# (fixed lengths, ignore_eos), concurrency 1, 4, 16 and 64. Also the cold start (launch to
# /health 200). Runs on the GPU machine through the device tool (needs .device/cuda from
# tools/device/bundle.sh, carry [".device/cuda.tar.xz"]); builds nothing.
# Files back in $OUT: serve-tp-bench.log (everything), server.log, bench-*.json.
# Environment: TP (default: every GPU), EXTRA (more serve flags, e.g. --disable-custom-all-reduce),
# CONCURRENCY ("1 4 16 64"), WORKLOADS ("1024:1024 8192:1024"), PROMPTS_PER_CONC (4).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
LOG=$OUT/serve-tp-bench.log
GPUS=$(nvidia-smi -L | wc -l)
TP=${TP:-$GPUS}
PORT=30188
M=$(mktemp -d)
# MiniMax-M3.1-Flash's text config (§1 of the architecture: the values of MiniMaxM3Config's
# defaults) with the bundled model's tokenizer and template. The tokenizer knows 4,096 of the
# 200,064 ids: the bench's prompts are token ids and it counts tokens, not text.
cp models/m3-tiny/{tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} "$M/"
python3 - "$M/config.json" <<'PY'
import json, sys
c = json.load(open("models/m3-tiny/config.json"))
t = c["text_config"]
L = 60
t.update(vocab_size=200064, hidden_size=6144, intermediate_size=3072, dense_intermediate_size=12288,
         shared_intermediate_size=3072, num_hidden_layers=L, num_attention_heads=64,
         num_key_value_heads=4, head_dim=128, max_position_embeddings=524288, rope_theta=5e6,
         rotary_dim=64, partial_rotary_factor=0.5, num_local_experts=128, num_experts_per_tok=4,
         n_shared_experts=1, routed_scaling_factor=2.0, moe_layer_freq=[0] * 3 + [1] * (L - 3))
t["sparse_attention_config"].update(sparse_num_index_heads=4, sparse_index_dim=128,
         sparse_block_size=128, sparse_topk_blocks=16, sparse_local_block=1, sparse_init_block=1,
         sparse_attention_freq=[1] * L, sparse_disable_index_value=[1] * L)
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
t0=$(date +%s.%N)
"$B/m3serve" serve --model-path "$M" --load-format dummy --device cuda --tp "$TP" --port "$PORT" \
  ${EXTRA:-} >"$OUT/server.log" 2>&1 &
SERVER=$!
ready=no
for _ in $(seq 1 1200); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then ready=yes; break; fi
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
