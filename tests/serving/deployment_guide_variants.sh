#!/usr/bin/env bash
# The deployment guide's other command lines on the CPU with the bundled m3-tiny: the offline
# variant (HF_HUB_OFFLINE=1, a local folder, no --revision) and vLLM's spellings reach "ready"
# with /health 200 and a note for each flag that changes nothing here; the HiCache and H200
# variants' --tp 8 and --ep 8 serve on eight CPU ranks; their flags whose features are not built
# yet (--dp 2 with DP attention, --kv-cache-dtype fp8_e4m3 on GPUs, the host KV tier on GPU ranks)
# are refused at startup naming the flag (fp8 KV on CPU ranks serves); the HiCache variant
# serves with its host tier on the CPU; and a
# --context-length beyond the model's maximum fails naming both numbers.
# Usage: deployment_guide_variants.sh <m3serve binary>
set -euo pipefail

BIN=${1:-${M3SERVE_BIN:-build/bin/m3serve}}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  [ -f "$WORK/log" ] && { echo "--- server log ---" >&2; cat "$WORK/log" >&2; }
  exit 1
}

# The guide's flags that every variant keeps.
COMMON=(--trust-remote-code --reasoning-parser minimax-m3 --tool-call-parser minimax-m3
        --moe-runner-backend flashinfer_trtllm_routed --cuda-graph-backend-prefill breakable
        --chunked-prefill-size 32768 --max-running-requests 128 --cuda-graph-max-bs-decode 128
        --tokenizer-worker-num 8 --host 127.0.0.1 --port 0)

# serves NAME NOTE... -- ARGS...: starts m3serve with ARGS, waits for ready and /health 200,
# checks a startup note for each NOTE flag, stops the server.
serves() {
  local name=$1 notes=()
  shift
  while [ "$1" != -- ]; do notes+=("$1"); shift; done
  shift
  : >"$WORK/log"
  "$BIN" serve "$@" >"$WORK/log" 2>&1 &
  SERVER_PID=$!
  local port=
  for _ in $(seq 1 600); do
    port=$(sed -n "s|.*ready: serving .* on http://127.0.0.1:\([0-9]*\).*|\1|p" "$WORK/log" | head -n1)
    [ -n "$port" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || fail "$name: the server exited"
    sleep 0.1
  done
  [ -n "$port" ] || fail "$name: not ready"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] ||
    fail "$name: /health is not 200"
  for flag in "${notes[@]}"; do
    grep -q "note: $flag" "$WORK/log" || fail "$name: no startup note for $flag"
  done
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" || fail "$name: the drain did not exit 0"
  SERVER_PID=
  echo "ok $name: ready, /health 200, ${#notes[@]} notes"
}

# refused NAME STATUS TEXT -- ARGS...: m3serve exits with STATUS and names TEXT.
refused() {
  local name=$1 status=$2 text=$3
  shift 4
  local rc=0
  timeout 60 "$BIN" serve "$@" >"$WORK/log" 2>&1 || rc=$?
  [ "$rc" = "$status" ] || fail "$name: exit $rc, wanted $status"
  grep -q -- "$text" "$WORK/log" || fail "$name: the error does not name '$text'"
  echo "ok $name: exit $status naming '$text'"
}

# Offline: a local folder as `hf download --local-dir` leaves it, no --revision.
mkdir -p "$WORK/models"
cp -r "$ROOT/models/m3-tiny" "$WORK/models/MiniMax-M3.1-Flash"
HF_HUB_OFFLINE=1 serves "offline, local folder" --trust-remote-code --moe-runner-backend \
  --cuda-graph-backend-prefill --cuda-graph-max-bs-decode -- \
  "${COMMON[@]}" --model-path "$WORK/models/MiniMax-M3.1-Flash" --tp 1 --mem-fraction-static 0.8 \
  --context-length 1024
grep -q "ready: serving '$WORK/models/MiniMax-M3.1-Flash'" "$WORK/log" ||
  fail "offline: the served name is not --model-path as given"

# The H200 recipe's eight ranks, as CPU ranks.
serves "H200 --tp 8" -- "${COMMON[@]}" --model-path "$WORK/models/MiniMax-M3.1-Flash" \
  --tp 8 --context-length 1024
grep -q "layout: 8 CPU ranks" "$WORK/log" || fail "--tp 8: no 8-rank layout in the report"
# --ep 8 alone: eight ranks, one routed expert of m3-tiny's eight on each.
serves "--ep 8" -- "${COMMON[@]}" --model-path "$WORK/models/MiniMax-M3.1-Flash" \
  --ep 8 --context-length 1024
grep -q "(tp 8, dp 1, ep 8); routed experts: 1 of 8 per rank" "$WORK/log" ||
  fail "--ep 8: no expert-parallel layout in the report"
grep -q "weights: .* per rank on the CPU" "$WORK/log" || fail "--ep 8: no weights per rank"

# vLLM's spellings of the same.
serves "vLLM flags" --enable-expert-parallel --block-size -- \
  --model-path "$WORK/models/MiniMax-M3.1-Flash" --tensor-parallel-size 1 \
  --enable-expert-parallel --block-size 128 --max-model-len 2048 --gpu-memory-utilization 0.5 \
  --host 127.0.0.1 --port 0

# The HiCache variant serves (the guide's --hicache-size 64 is more host memory than a test
# machine has: 1 GB here) and reports its host tier; on GPU ranks (--device cuda --tp 8) it is
# refused by name.
M=(--model-path "$WORK/models/MiniMax-M3.1-Flash")
serves "HiCache" -- "${COMMON[@]}" "${M[@]}" --enable-hierarchical-cache --hicache-size 1
grep -q "HiCache: host tier" "$WORK/log" || fail "HiCache: no host tier in the startup report"
refused "HiCache on GPU ranks" 2 "--enable-hierarchical-cache with --device cuda --tp/--ep" -- \
  "${COMMON[@]}" "${M[@]}" --device cuda --tp 8 --enable-hierarchical-cache --hicache-size 64
# fp8 KV serves on one CPU rank and on the recipe's eight, and says so (on GPUs:
# tools/device/serve-smoke.sh with SERVE_ARGS="--kv-cache-dtype fp8_e4m3").
serves "fp8 KV" -- "${COMMON[@]}" "${M[@]}" --kv-cache-dtype fp8_e4m3 --context-length 1024
grep -q "KV cache: kv dtype fp8_e4m3 (.* bytes per token), [0-9]* tokens fit" "$WORK/log" ||
  fail "fp8 KV: the startup report does not name the KV dtype"
serves "fp8 KV on ranks" -- "${COMMON[@]}" "${M[@]}" --tp 8 --kv-cache-dtype fp8_e4m3 \
  --context-length 1024
grep -q "KV cache: kv dtype fp8_e4m3 (.* bytes per token), [0-9]* tokens fit" "$WORK/log" ||
  fail "fp8 KV on ranks: the startup report does not name the KV dtype"
refused "DP attention" 2 "--dp 2" -- "${COMMON[@]}" "${M[@]}" --tp 1 --enable-dp-attention --dp 2
refused "H200 context" 1 "--context-length 140000 exceeds the model's max_position_embeddings 4096" \
  -- "${COMMON[@]}" "${M[@]}" --context-length 140000
