#!/usr/bin/env bash
# DSpark on the bundled model, served: m3serve serve on models/m3-tiny with and without
# --speculative-algorithm DSPARK, the held-out evaluation set (eval.mjs, one request at a time) at
# temperature 0 and 0.7, and from the server's /metrics: the mean accepted length (tokens committed
# per verify step), the draft acceptance rate and the generated tokens per second of wall time.
#   tools/train_tiny/dspark_acceptance.sh [m3serve binary]     (from anywhere; CPU by default)
# Environment: LIMIT (items per task, default 0: all), EXTRA (more serve flags, e.g. "--device cuda"),
# TEMPS (default "0 0.7"), PORT (default 8019).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build/bin/m3serve}
PORT=${PORT:-8019}
WORK=$(mktemp -d)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
# metric NAME: the value of m3serve:NAME (0 when absent).
metric() {
  local v
  v=$(sed -n "s/^m3serve:$1{[^}]*} \([0-9.e+]*\).*/\1/p" "$WORK/metrics" | head -n1)
  echo "${v:-0}"
}
printf '%-8s %-5s %10s %12s %10s %9s %8s\n' draft T accuracy accept_len accept_rate tokens tok/s
for spec in none DSPARK; do
  args=(serve --model-path "$ROOT/models/m3-tiny" --served-model-name m3-tiny --port "$PORT" ${EXTRA:-})
  [ "$spec" = DSPARK ] && args+=(--speculative-algorithm DSPARK)
  "$BIN" "${args[@]}" >"$WORK/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/server.log" >&2; exit 1; }
    sleep 0.2
  done
  for t in ${TEMPS:-0 0.7}; do
    curl -s "http://127.0.0.1:$PORT/metrics" >"$WORK/metrics"
    g0=$(metric generation_tokens_total); s0=$(metric spec_accept_length_sum)
    c0=$(metric spec_accept_length_count); d0=$(metric spec_draft_tokens_total)
    a0=$(metric spec_accepted_tokens_total)
    t0=$(date +%s.%N)
    node "$ROOT/tools/train_tiny/eval.mjs" --backend server --url "http://127.0.0.1:$PORT/v1" \
      --concurrency 1 --min 0 --limit "${LIMIT:-0}" --temperature "$t" >"$WORK/eval.txt" 2>&1 || true
    t1=$(date +%s.%N)
    curl -s "http://127.0.0.1:$PORT/metrics" >"$WORK/metrics"
    acc=$(awk '$1 == "arith" || $1 == "tool" { gsub(/[()]/, "", $3); split($3, f, "/"); n += f[1]; d += f[2] }
               END { printf "%d/%d", n, d }' "$WORK/eval.txt")
    node -e "
      const [g, s, c, d, a, dt] = [$(metric generation_tokens_total) - $g0, $(metric spec_accept_length_sum) - $s0,
        $(metric spec_accept_length_count) - $c0, $(metric spec_draft_tokens_total) - $d0,
        $(metric spec_accepted_tokens_total) - $a0, $t1 - $t0];
      console.log([process.argv[1].padEnd(8), process.argv[2].padEnd(5), process.argv[3].padStart(10),
        (c > 0 ? (s / c).toFixed(2) : '-').padStart(12), (d > 0 ? (a / d).toFixed(3) : '-').padStart(10),
        String(g).padStart(9), (g / dt).toFixed(1).padStart(8)].join(' '));" "$spec" "$t" "$acc"
  done
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=
done
