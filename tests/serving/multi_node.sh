#!/usr/bin/env bash
# Two processes as two nodes (--nnodes 2, CPU ranks, --tp 4: two ranks each) rendezvous over
# loopback and serve the bundled model; its greedy text equals one process's. Then the failure
# paths, each bounded in time:
#   - node 1 is killed in the middle of a stream: the stream ends with an error, /health and new
#     requests answer 503, and node 0 exits non-zero within --dist-timeout naming node 1;
#   - node 1 hangs (SIGSTOP) in the middle of a stream: node 0's collective times out after
#     --dist-timeout and it exits non-zero;
#   - node 0 is killed: node 1 exits non-zero naming node 0;
#   - node 0 stops cleanly (SIGTERM): node 1 exits 0;
#   - node 0 alone: the rendezvous times out and it exits non-zero naming the address.
# With "dp" as the second argument, the nodes serve --tp 4 --enable-dp-attention --dp 2 instead
# (attention group 0 on node 0, group 1 on node 1, each group's ranks joined through the
# rendezvous; the MoE layers over all four ranks): two requests at once, one per group, each give
# one process's greedy text, and node 1 killed mid-stream still gives an error event, 503s and a
# non-zero exit within --dist-timeout. The other failure paths do not depend on --dp and run only
# without it. With "dspark", the same --dp 2 nodes serve with --speculative-algorithm DSPARK (the
# bundled draft on node 0 beside rank 0, fed with both groups' captured hidden states): both
# groups' greedy text equals one process's without a draft, and the draft proposed tokens.
# Usage: multi_node.sh <m3serve binary> [dp|dspark]
set -euo pipefail

BIN=${1:-${M3SERVE_BIN:-build/bin/m3serve}}
MODE=${2:-tp}
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.log; do echo "--- $f" >&2; cat "$f" >&2; done
  exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
TIMEOUT=10
COMMON=(--device cpu --tp 4 --nnodes 2 --dist-timeout "$TIMEOUT")
[ "$MODE" != tp ] && COMMON+=(--enable-dp-attention --dp 2)
[ "$MODE" = dspark ] && COMMON+=(--speculative-algorithm DSPARK)

# start_nodes TAG: node 0 on $PORT, node 1; waits for /health 200.
start_nodes() {
  PORT=$(free_port)
  ADDR=127.0.0.1:$(free_port)
  "$BIN" serve "${COMMON[@]}" --node-rank 0 --dist-init-addr "$ADDR" --host 127.0.0.1 \
    --port "$PORT" >"$WORK/$1-node0.log" 2>&1 &
  N0=$!
  "$BIN" serve "${COMMON[@]}" --node-rank 1 --dist-init-addr "$ADDR" >"$WORK/$1-node1.log" 2>&1 &
  N1=$!
  PIDS+=("$N0" "$N1")
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    kill -0 "$N0" 2>/dev/null || fail "$1: node 0 exited before ready"
    sleep 0.25
  done
  fail "$1: no /health 200 within 60 s"
}
# exits_within PID SECONDS: waits for it (a child of this shell) and sets RC to its exit code;
# fails if it is still running after SECONDS.
exits_within() {
  local pid=$1 limit=$2 t=0
  while kill -0 "$pid" 2>/dev/null; do
    # A child that has exited but is not reaped yet still answers kill -0: reap it.
    [ -z "$(ps -o stat= -p "$pid" 2>/dev/null | grep -v Z)" ] && break
    [ "$t" -ge $((limit * 4)) ] && fail "process $pid still running after $limit s"
    sleep 0.25
    t=$((t + 1))
  done
  RC=0
  wait "$pid" || RC=$?
}
complete() {  # port prompt [max_tokens] -> greedy text
  curl -s "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$2\", \"max_tokens\": ${3:-24}, \"temperature\": 0, \"ignore_eos\": true}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
start_solo() {  # one process, no ranks: the reference
  SOLO_PORT=$(free_port)
  "$BIN" serve --device cpu --host 127.0.0.1 --port "$SOLO_PORT" >"$WORK/solo.log" 2>&1 &
  SOLO=$!
  PIDS+=("$SOLO")
  for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$SOLO_PORT/health" >/dev/null 2>&1 && break; sleep 0.25; done
}

# ---- 1. Serve, and equal one process's greedy text.
start_nodes serve
if [ "$MODE" != tp ]; then
  # Two requests at once: round_robin places the first on group 0 (node 0's ranks) and the second
  # on group 1 (node 1's), so steps carry both groups' slices. 40 tokens fill a 32-token page,
  # which each group's prefix cache then holds.
  complete "$PORT" "The capital of France is" 40 >"$WORK/a.txt" &
  A=$!
  complete "$PORT" "Count from one to ten:" 40 >"$WORK/b.txt" &
  B=$!
  wait "$A" "$B"
  start_solo
  for pair in "a:The capital of France is" "b:Count from one to ten:"; do
    got=$(cat "$WORK/${pair%%:*}.txt")
    want=$(complete "$SOLO_PORT" "${pair#*:}" 40)
    [ -n "$got" ] && [ "$got" = "$want" ] ||
      fail "two nodes with --dp 2 gave '$got' for '${pair#*:}', one process '$want'"
  done
  kill -TERM "$SOLO"
  metrics=$(curl -s "http://127.0.0.1:$PORT/metrics")
  for g in 0 1; do
    echo "$metrics" | grep -E "^m3serve:kv_pages_cached\{.*dp_rank=\"$g\"\} [1-9]" >/dev/null ||
      fail "DP group $g holds no cached page after its request: $(echo "$metrics" | grep kv_pages_cached)"
  done
  grep -q "layout: 2 of 4 CPU ranks on node 0 of 2 over Gloo (tp 4, dp 2" "$WORK/serve-node0.log" ||
    fail "no dp layout line"
  grep -q "checkpoint read: .* by rank 0 (.*by rank 1 (" "$WORK/serve-node0.log" ||
    fail "node 0 does not report its ranks' checkpoint reads"
  grep -q "node 1 of 2: ready: .*checkpoint read: .* by rank 2 (.*by rank 3 (" \
    "$WORK/serve-node1.log" || fail "node 1 does not report its ranks' checkpoint reads"
  echo "ok: two nodes serve --dp 2, both groups' greedy text equals one process's"
  if [ "$MODE" = dspark ]; then
    drafted=$(echo "$metrics" | sed -n 's/^m3serve:spec_draft_tokens_total{[^}]*} \([0-9.e+]*\)$/\1/p')
    awk -v n="${drafted:-0}" 'BEGIN { exit !(n > 0) }' ||
      fail "DSPARK over two nodes drafted no token: $(echo "$metrics" | grep spec_)"
    echo "ok: DSPARK over two nodes with --dp 2 drafted $drafted tokens, losslessly"
    exit 0
  fi
else
  got=$(complete "$PORT" "The capital of France is")
  start_solo
  want=$(complete "$SOLO_PORT" "The capital of France is")
  kill -TERM "$SOLO"
  [ -n "$got" ] && [ "$got" = "$want" ] || fail "two nodes gave '$got', one process '$want'"
  grep -q "layout: 2 of 4 CPU ranks on node 0 of 2" "$WORK/serve-node0.log" || fail "no layout line"
  grep -q "node 1 of 2: ready" "$WORK/serve-node1.log" || fail "node 1 not ready"
  echo "ok: two nodes serve, greedy text equals one process's"
fi

# ---- 2. Node 1 dies mid-stream.
curl -sN "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Count", "max_tokens": 3000, "ignore_eos": true, "stream": true}' \
  >"$WORK/stream.txt" 2>&1 &
STREAM=$!
for _ in $(seq 1 40); do [ "$(grep -c '^data:' "$WORK/stream.txt" || true)" -ge 3 ] && break; sleep 0.1; done
[ "$(grep -c '^data:' "$WORK/stream.txt" || true)" -ge 3 ] || fail "the stream did not start"
kill -9 "$N1"
t0=$SECONDS
# The stream ends (not hangs) with an error event: at once where a collective waits on node 1's
# closed connections, after --dist-timeout where it waits on a rank that itself waits on node 1;
# the bound leaves 5 s of slack past the timeout, as for node 0's exit below.
for _ in $(seq 1 $(((TIMEOUT + 5) * 4))); do kill -0 "$STREAM" 2>/dev/null || break; sleep 0.25; done
kill -0 "$STREAM" 2>/dev/null && fail "the stream did not end after node 1 died"
grep -q '"error"' "$WORK/stream.txt" || fail "the stream ended without an error event"
# While node 0 drains: 503s (or it has already gone).
code=$(curl -s -o "$WORK/after.json" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" \
  -H 'Content-Type: application/json' -d '{"prompt": "x", "max_tokens": 2}' || true)
case "$code" in 503 | 000) ;; *) fail "a request after the failure answered $code" ;; esac
exits_within "$N0" $((TIMEOUT + 5))
rc=$RC
[ "$rc" -ne 0 ] || fail "node 0 exited 0 after node 1 died"
grep -q "fatal: node 1 (ranks 2..3) left the rendezvous" "$WORK/serve-node0.log" ||
  fail "node 0's log does not name node 1"
echo "ok: node 1 killed: stream error, $code, node 0 exited $rc after $((SECONDS - t0)) s"
[ "$MODE" = dp ] && exit 0

# ---- 2b. Node 1 hangs: the collective times out after --dist-timeout.
start_nodes hang
curl -sN "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Count", "max_tokens": 3000, "ignore_eos": true, "stream": true}' \
  >"$WORK/hang-stream.txt" 2>&1 &
for _ in $(seq 1 40); do [ "$(grep -c '^data:' "$WORK/hang-stream.txt" || true)" -ge 3 ] && break; sleep 0.1; done
kill -STOP "$N1"
t0=$SECONDS
exits_within "$N0" $((TIMEOUT + 10))
rc=$RC
kill -9 "$N1" 2>/dev/null || true
[ "$rc" -ne 0 ] || fail "node 0 exited 0 after node 1 hung"
grep -q "fatal:" "$WORK/hang-node0.log" || fail "node 0's log has no fatal line after node 1 hung"
grep -q '"error"' "$WORK/hang-stream.txt" || fail "the stream ended without an error event"
echo "ok: node 1 hung: node 0 exited $rc after $((SECONDS - t0)) s (--dist-timeout $TIMEOUT)"

# ---- 3. Node 0 dies: node 1 exits non-zero, naming it.
start_nodes kill0
kill -9 "$N0"
exits_within "$N1" $((TIMEOUT + 5))
rc=$RC
[ "$rc" -ne 0 ] || fail "node 1 exited 0 after node 0 died"
grep -q "fatal: node 1 of 2: node 0 (ranks 0..1) is gone" "$WORK/kill0-node1.log" ||
  fail "node 1's log does not name node 0"
echo "ok: node 0 killed: node 1 exited $rc"

# ---- 4. Node 0 stops cleanly: node 1 follows with 0.
start_nodes clean
kill -TERM "$N0"
exits_within "$N0" 20
rc0=$RC
exits_within "$N1" 20
rc1=$RC
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || fail "clean stop: node 0 exited $rc0, node 1 $rc1"
grep -q "node 0 shut down" "$WORK/clean-node1.log" || fail "node 1 did not see the shutdown"
echo "ok: clean stop: both exited 0"

# ---- 5. Node 0 alone: the rendezvous times out, naming the address.
ADDR=127.0.0.1:$(free_port)
"$BIN" serve --device cpu --tp 4 --nnodes 2 --node-rank 0 --dist-init-addr "$ADDR" \
  --dist-timeout 2 --host 127.0.0.1 --port "$(free_port)" >"$WORK/alone.log" 2>&1 &
ALONE=$!
PIDS+=("$ALONE")
exits_within "$ALONE" 20
rc=$RC
[ "$rc" -ne 0 ] || fail "node 0 alone exited 0"
grep -q "$ADDR" "$WORK/alone.log" || fail "the rendezvous error does not name $ADDR"
echo "ok: node 0 alone: exited $rc naming $ADDR"
