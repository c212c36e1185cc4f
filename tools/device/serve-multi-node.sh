#!/usr/bin/env bash
# GPU ranks over two nodes (`--device cuda --tp 2 --nnodes 2`), as two processes on one host over
# loopback, one GPU each (CUDA_VISIBLE_DEVICES=0 and 1): node 0 serves HTTP and sends every step
# to node 1, whose GPU follows in lock step; one NCCL group over both, its unique id handed out
# through the rendezvous at --dist-init-addr. Runs on the GPU machine through the device tool
# (needs 2 GPUs and .device/cuda from `tools/device/bundle.sh m3serve`, carry
# [".device/cuda.tar.xz"]); builds nothing. With fewer than 2 GPUs it says SKIP and exits 0.
#
# The model: tools/device/flash-config.sh's MiniMax-M3.1-Flash shapes with LAYERS (4) layers,
# `--load-format dummy` (weights generated on each GPU, its slice only). Checks, each bounded in
# time:
#   1. reference: one process `--tp 2` on both GPUs with --disable-custom-all-reduce (NCCL sums,
#      as over nodes), a greedy completion;
#   2. two nodes: the same completion answers 200 with the same text (two ranks' float32 sums are
#      exact in any order, the kernels are the same), the startup logs name the layout and the
#      NCCL path, node 1 says it is ready;
#   3. node 1 killed mid-stream: the stream ends with an error event, /health and a new request
#      answer 503 (or node 0 is already gone), node 0 exits non-zero within --dist-timeout + 10 s,
#      its last line naming node 1;
#   4. node 0 killed: node 1 exits non-zero within --dist-timeout + 10 s naming node 0;
#   5. node 0 stopped cleanly (SIGTERM): both exit 0.
# Files back in $OUT: serve-multi-node.log (everything), node0.log, node1.log (the last pair
# started), ref.log.
# Environment: LAYERS (4), TIMEOUT (--dist-timeout, 20), M3SERVE (.device/cuda/m3serve), EXTRA
# (more flags for every process, e.g. "--ep 2" for --tp 2 --ep 2). For a check of the script
# itself on a machine without a GPU: DEVICE=cpu MODEL=models/m3-tiny (CPU ranks; the GPU log
# lines are then not looked for) with BIN_DIR naming a folder with BUILD_INFO and a fake
# nvidia-smi on PATH.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
. tools/device/health.sh
LOG=$OUT/serve-multi-node.log
BIN=${M3SERVE:-$B/m3serve}
TIMEOUT=${TIMEOUT:-20}
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
say() { echo "$*" | tee -a "$LOG"; }
if [ "$GPUS" -lt 2 ]; then
  say "serve-multi-node SKIP: needs 2 GPUs, found $GPUS (NCCL refuses two ranks on one GPU; the"
  say "one-GPU check of the same runner code is cuda_tensor_parallel_test's"
  say "CudaTensorParallel.TwoNodesOnOneGpuFollowNodeZeroBitwise)"
  exit 0
fi
DEVICE=${DEVICE:-cuda}
M=$(mktemp -d)
MODEL=${MODEL:-$M/model}
[ -e "$MODEL/config.json" ] || tools/device/flash-config.sh "$MODEL" "${LAYERS:-4}"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT
RC=0
fail() { say "FAIL: $*"; RC=1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Plain HTTP through bash's /dev/tcp (the GPU machine may have no curl): http METHOD PORT PATH
# [BODY] prints the status code, then the body, into $M/resp.
http() {
  local body=${4:-}
  { exec 3<>"/dev/tcp/127.0.0.1/$2"; } 2>/dev/null || { echo 000 >"$M/resp"; return; }
  printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
    "$1" "$3" "${#body}" "$body" >&3
  timeout 120 cat <&3 >"$M/raw"
  exec 3<&- 3>&-
  python3 - "$M/raw" >"$M/resp" <<'PY'
import sys
raw = open(sys.argv[1], "rb").read()
head, _, body = raw.partition(b"\r\n\r\n")
code = head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "000"
if b"chunked" in head.lower():  # de-chunk
    out, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    body = out
print(code)
sys.stdout.write(body.decode("utf-8", "replace"))
PY
}
# A streamed request's raw bytes into FILE as they come (no de-chunking: grep finds the events).
stream_to() {  # file port body
  { exec 4<>"/dev/tcp/127.0.0.1/$2"; } 2>/dev/null || return
  printf 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
    "${#3}" "$3" >&4
  timeout 300 cat <&4 >"$1"
  exec 4<&- 4>&-
}
PROMPT='{"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0, "ignore_eos": true}'
completion_text() {  # port -> the greedy text, or empty
  http POST "$1" /v1/completions "$PROMPT"
  [ "$(head -1 "$M/resp")" = 200 ] || { tail -n +2 "$M/resp" | head -c 400 >>"$LOG"; return; }
  tail -n +2 "$M/resp" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
wait_health() {  # port pid seconds
  for _ in $(seq 1 $(($3 * 4))); do
    health_ok "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.25
  done
  return 1
}
exits_within() {  # pid seconds: sets EXIT to its status, or "running" after the limit
  local t=0
  EXIT=running
  while kill -0 "$1" 2>/dev/null; do
    [ -z "$(ps -o stat= -p "$1" 2>/dev/null | grep -v Z)" ] && break
    [ "$t" -ge $(($2 * 4)) ] && return
    sleep 0.25
    t=$((t + 1))
  done
  EXIT=0
  wait "$1" || EXIT=$?
}
COMMON=(--model-path "$MODEL" --load-format dummy --device "$DEVICE" --tp 2 --dist-timeout "$TIMEOUT"
        ${EXTRA:-})
start_nodes() {  # tag: node 0 on GPU 0 ($PORT), node 1 on GPU 1; waits for /health 200
  PORT=$(free_port)
  ADDR=127.0.0.1:$(free_port)
  CUDA_VISIBLE_DEVICES=0 "$BIN" serve "${COMMON[@]}" --nnodes 2 --node-rank 0 \
    --dist-init-addr "$ADDR" --host 127.0.0.1 --port "$PORT" >"$OUT/node0.log" 2>&1 &
  N0=$!
  CUDA_VISIBLE_DEVICES=1 "$BIN" serve "${COMMON[@]}" --nnodes 2 --node-rank 1 \
    --dist-init-addr "$ADDR" >"$OUT/node1.log" 2>&1 &
  N1=$!
  PIDS+=("$N0" "$N1")
  local t0=$SECONDS
  if wait_health "$PORT" "$N0" 300; then
    say "$1: two nodes ready after $((SECONDS - t0)) s"
    return 0
  fi
  fail "$1: no /health 200 from node 0 within 300 s"
  tail -20 "$OUT/node0.log" "$OUT/node1.log" >>"$LOG"
  return 1
}
{
  echo "== $(date -u +%FT%TZ) $(hostname), $GPUS GPUs, --tp 2 --nnodes 2 ${EXTRA:-}"
  cat "$B/BUILD_INFO" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total --format=csv
} >>"$LOG" 2>&1

# ---- 1. The reference: one process, both GPUs, NCCL sums.
REF_PORT=$(free_port)
CUDA_VISIBLE_DEVICES=0,1 "$BIN" serve "${COMMON[@]}" --disable-custom-all-reduce --host 127.0.0.1 \
  --port "$REF_PORT" >"$OUT/ref.log" 2>&1 &
REF=$!
PIDS+=("$REF")
want=""
if wait_health "$REF_PORT" "$REF" 300; then
  want=$(completion_text "$REF_PORT")
else
  fail "the one-process --tp 2 reference did not start"
  tail -20 "$OUT/ref.log" >>"$LOG"
fi
kill -TERM "$REF" 2>/dev/null
exits_within "$REF" 60
say "reference (one process --tp 2): '$want'"

# ---- 2. Two nodes serve the same text.
if start_nodes serve; then
  got=$(completion_text "$PORT")
  say "two nodes: '$got'"
  if [ -z "$got" ]; then
    fail "the completion over two nodes did not answer 200"
  elif [ -n "$want" ] && [ "$got" != "$want" ]; then
    fail "two nodes gave another greedy text than one process"
  fi
  if [ "$DEVICE" = cuda ]; then
    grep -q "layout: 1 of 2 GPUs (ranks 0..0) on node 0 of 2 over NCCL" "$OUT/node0.log" ||
      fail "node 0 has no multi-node layout line"
    grep -q "all-reduce NCCL (ranks 0..0 of 2 here" "$OUT/node0.log" ||
      fail "node 0 does not say the all-reduce goes over NCCL"
  fi
  grep -q "node 1 of 2: ready" "$OUT/node1.log" || fail "node 1 did not say it is ready"
  grep -E "^m3serve: (--tp|layout|KV cache|memory profile)" "$OUT/node0.log" >>"$LOG"
  grep -E "^m3serve: (--tp|node 1)" "$OUT/node1.log" >>"$LOG"

  # ---- 3. Node 1 dies mid-stream.
  stream_to "$M/stream.txt" "$PORT" \
    '{"prompt": "Count", "max_tokens": 3000, "ignore_eos": true, "stream": true}' &
  STREAM=$!
  for _ in $(seq 1 120); do [ "$(grep -c '^data:' "$M/stream.txt" 2>/dev/null || true)" -ge 3 ] && break; sleep 0.25; done
  [ "$(grep -c '^data:' "$M/stream.txt" 2>/dev/null || true)" -ge 3 ] || fail "the stream did not start"
  kill -9 "$N1"
  t0=$SECONDS
  for _ in $(seq 1 $(((TIMEOUT + 10) * 4))); do kill -0 "$STREAM" 2>/dev/null || break; sleep 0.25; done
  if kill -0 "$STREAM" 2>/dev/null; then
    fail "the stream did not end within --dist-timeout + 10 s after node 1 died"
  fi
  grep -q '"error"' "$M/stream.txt" || fail "the stream ended without an error event"
  grep '"error"' "$M/stream.txt" | head -c 400 >>"$LOG"
  cp "$M/stream.txt" "$OUT/stream.txt"
  http GET "$PORT" /health
  health=$(head -1 "$M/resp")
  http POST "$PORT" /v1/completions '{"prompt": "x", "max_tokens": 2}'
  after=$(head -1 "$M/resp")
  case "$health:$after" in 503:503 | 503:000 | 000:000) ;; *) fail "after node 1 died: /health $health, a request $after" ;; esac
  exits_within "$N0" $((TIMEOUT + 10))
  [ "$EXIT" = running ] && fail "node 0 still running $((TIMEOUT + 10)) s after node 1 died"
  [ "$EXIT" = 0 ] && fail "node 0 exited 0 after node 1 died"
  grep -q "fatal: node 1 (ranks 1..1) left the rendezvous" "$OUT/node0.log" ||
    fail "node 0's log does not name node 1"
  say "node 1 killed mid-stream: /health $health, request $after, node 0 exited $EXIT after $((SECONDS - t0)) s"
  tail -3 "$OUT/node0.log" >>"$LOG"
fi

# ---- 4. Node 0 dies: node 1 exits non-zero naming it.
if start_nodes kill0; then
  kill -9 "$N0"
  t0=$SECONDS
  exits_within "$N1" $((TIMEOUT + 10))
  [ "$EXIT" = running ] && fail "node 1 still running $((TIMEOUT + 10)) s after node 0 died"
  [ "$EXIT" = 0 ] && fail "node 1 exited 0 after node 0 died"
  grep -q "fatal: node 1 of 2: node 0 (ranks 0..0) is gone" "$OUT/node1.log" ||
    fail "node 1's log does not name node 0"
  say "node 0 killed: node 1 exited $EXIT after $((SECONDS - t0)) s"
fi

# ---- 5. Node 0 stops cleanly: node 1 follows with 0.
if start_nodes clean; then
  kill -TERM "$N0"
  exits_within "$N0" 60
  rc0=$EXIT
  exits_within "$N1" 60
  rc1=$EXIT
  [ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "clean stop: node 0 exited $rc0, node 1 $rc1"
  grep -q "node 0 shut down" "$OUT/node1.log" || fail "node 1 did not see the shutdown"
  say "clean stop: node 0 exited $rc0, node 1 $rc1"
fi
say "serve-multi-node rc=$RC"
exit "$RC"
