#!/usr/bin/env bash
# HiCache on `m3serve serve --device cuda`, end to end, on the GPU machine (through the device
# tool; needs .device/cuda from `tools/device/bundle.sh m3serve`, carry [".device/cuda.tar.xz"]).
#
# For each model: the bundled m3-tiny (the float32 CUDA backend's page copier) and MiniMax-M3.1-
# Flash's shapes with 4 layers and dummy weights (tools/device/flash-config.sh; the real-shape
# runner's CudaKvPageCopier: pinned host tier, copy streams):
#   A. the radix prefix cache in a KV pool large enough to keep every page;
#   B. a device pool of one request's context (1536 tokens for m3-tiny, 4096 for the other) and
#      4 pages more, with
#      `--enable-hierarchical-cache`: pages evicted from the GPU go to the host tier, and a later
#      turn's prefix comes back from it.
# Three conversations of TURNS turns each are interleaved, greedy, through the OpenAI API. Both
# servers reuse prefixes at the same page boundaries, so a page restored from the host must give
# B exactly A's replies; B's host-tier hit tokens must be above zero. Files back in $OUT:
# serve-hicache.log, server-*.log, replies-*.json.
# Environment: TURNS (12), POOL_PAGES (the device pool of B, in pages), MODELS ("tiny flash"),
# SERVE_ARGS (flags for both servers, e.g. "--tp 2"), EXTRA (flags for B only, e.g.
# "--hicache-write-policy write_back"), M3SERVE (.device/cuda/m3serve), DEVICE (cuda; cpu checks
# the script itself).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
. tools/device/bundle-env.sh
. tools/device/health.sh
LOG=$OUT/serve-hicache.log
: >"$LOG"
BIN=${M3SERVE:-$B/m3serve}
PORT=30179
TURNS=${TURNS:-12}
rc=0

start_server() {  # name model-dir flags...
  local name=$1 dir=$2
  shift 2
  "$BIN" serve --model-path "$dir" --device "${DEVICE:-cuda}" --port "$PORT" --context-length "$CTX" "$@" \
    >"$OUT/server-$name.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 240); do
    health_ok "$PORT" && return 0
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.5
  done
  echo "server $name did not start:"; tail -20 "$OUT/server-$name.log"
  return 1
}

stop_server() {
  kill "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
}

# The interleaved conversations; writes the replies (JSON) and prints the metrics that matter.
converse() {  # name model-dir
  python3 - "$PORT" "$2" "$TURNS" "$OUT/replies-$1.json" <<'PY'
import json, re, sys, urllib.error, urllib.request
port, model, turns, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
words = ("weather rain city report travel train price market email meeting river mountain "
         "number answer garden window table paper music cloud").split()
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        sys.exit(f"HTTP {e.code} from {path}: {e.read().decode(errors='replace')[:600]}")
convs = [[{"role": "system", "content": f"You are assistant number {c}."}] for c in range(3)]
replies = []
for t in range(turns):
    for c, msgs in enumerate(convs):
        text = " ".join(words[(7 * t + 3 * c + k) % len(words)] for k in range(40))
        msgs.append({"role": "user", "content": f"Turn {t}: {text}"})
        r = post("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 16,
                                          "temperature": 0, "seed": 0})
        reply = r["choices"][0]["message"].get("content") or ""
        msgs.append({"role": "assistant", "content": reply})
        replies.append({"turn": t, "conv": c, "prompt_tokens": r["usage"]["prompt_tokens"],
                        "reply": reply})
json.dump(replies, open(out, "w"), indent=1)
with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
    metrics = r.read().decode()
for line in metrics.splitlines():
    if re.match(r"m3serve:(prefix_cache_hit_tokens_total|hicache_hit_tokens_total|"
                r"hicache_host_pages_used|hicache_load_seconds_(sum|count)|kv_pages_total)", line):
        print("  " + line)
print(f"  last prompt: {replies[-1]['prompt_tokens']} tokens")
PY
}

{
  echo "== $(date -u +%FT%TZ) $(hostname)"
  cat "$B/BUILD_INFO" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
} >>"$LOG" 2>&1
for model in ${MODELS:-tiny flash}; do
  # The context length: three conversations must outgrow B's pool (one context and 4 pages).
  # Dummy weights' replies are long in tokens when their text is encoded again.
  if [ "$model" = tiny ]; then
    DIR=models/m3-tiny
    DUMMY=()
    CTX=1536
  else
    CTX=4096
    DIR=$(mktemp -d)
    bash tools/device/flash-config.sh "$DIR" 4 >/dev/null
    DUMMY=(--load-format dummy)
  fi
  {
    echo "== $model: A (radix cache, large pool)"
    # shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
    if start_server "$model-A" "$DIR" "${DUMMY[@]}" ${SERVE_ARGS:-}; then
      converse "$model-A" "$DIR" || rc=1
      stop_server
    else
      rc=1
    fi
    # The pool of B from A's report: POOL_PAGES pages of its page size and bytes per token.
    per_token=$(sed -n 's/.*(\([0-9.]*\) bytes per token).*/\1/p' "$OUT/server-$model-A.log" | head -1)
    page=$(sed -n 's/.* pages of \([0-9]*\) tokens.*/\1/p' "$OUT/server-$model-A.log" | head -1)
    # One request of the context length and 4 pages more, unless POOL_PAGES says otherwise.
    pages=${POOL_PAGES:-$(( ${page:-1} > 0 ? (CTX + ${page:-1} - 1) / ${page:-1} + 4 : 0 ))}
    pool_bytes=$(awk -v t="${per_token:-0}" -v p="${page:-0}" -v n="$pages" \
      'BEGIN { b = t * p; printf "%d", (b == int(b) ? b : int(b) + 1) * n }')
    echo "KV: ${per_token:-?} bytes per token, pages of ${page:-?} tokens: B's pool $pool_bytes bytes"
    grep -m2 "KV cache:\|HiCache" "$OUT/server-$model-A.log"
    echo "== $model: B (--enable-hierarchical-cache, $pages device pages)"
    # shellcheck disable=SC2086  # EXTRA is a list of flags
    if [ "$pool_bytes" -gt 0 ] && start_server "$model-B" "$DIR" "${DUMMY[@]}" ${SERVE_ARGS:-} \
        --kv-cache-bytes "$pool_bytes" --enable-hierarchical-cache \
        --hicache-ratio 8 ${EXTRA:-}; then
      grep -m2 "KV cache:\|HiCache" "$OUT/server-$model-B.log"
      converse "$model-B" "$DIR" || rc=1
      stop_server
    else
      rc=1
    fi
    python3 - "$OUT/replies-$model-A.json" "$OUT/replies-$model-B.json" "$OUT/server-$model-B.log" <<'PY' || rc=1
import json, sys
try:
    a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
except Exception as e:
    print("no replies to compare:", e); sys.exit(1)
same = sum(x == y for x, y in zip(a, b))
print(f"replies equal: {same} of {len(a)} (B answered {len(b)})")
for x, y in zip(a, b):
    if x != y:
        print("  first difference:", x, y); break
sys.exit(0 if same == len(a) == len(b) else 1)
PY
  } >>"$LOG" 2>&1
  host_hits=$(grep 'hicache_hit_tokens_total{.*tier="host"' "$LOG" | tail -1 | awk '{print $NF}')
  echo "$model: host-tier hit tokens ${host_hits:-none}" >>"$LOG"
  awk -v h="${host_hits:-0}" 'BEGIN { exit !(h > 0) }' || rc=1
done
echo "serve-hicache rc=$rc" >>"$LOG"
cat "$LOG"
exit "$rc"
