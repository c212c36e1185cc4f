#!/usr/bin/env bash
# The MiniMax-M3.1-Flash deployment guide end to end on the CPU: the bundled m3-tiny is laid out
# in a temporary Hugging Face cache as MiniMaxAI/MiniMax-M3.1-Flash (blobs, a snapshot of
# symlinks, refs/main), and `m3serve serve` starts with the guide's quickstart command line (--tp 4:
# four CPU ranks) as written, --speculative-algorithm DSPARK included: the snapshot's dspark/ folder
# (m3-tiny's trained draft) is the draft, on rank 0. Then the guide's requests, as curl sends them,
# with the guide's model name:
#   (a) a plain text chat            -> 200 with choices[0].message
#   (b) the same, thinking disabled  -> 200, no reasoning_content in the message
#   (c) reasoning_effort low         -> 200
#   (d) an image_url content part    -> a 400 OpenAI error object (the remote host is not on
#                                       --allowed-media-domains), never a crash
# and /health is still 200. Usage: deployment_guide_curl.sh <m3serve binary>
set -euo pipefail

BIN=${1:-${M3SERVE_BIN:-build/bin/m3serve}}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=MiniMaxAI/MiniMax-M3.1-Flash
WORK=$(mktemp -d)
LOG=$WORK/server.log
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
  echo "--- server log ---" >&2
  cat "$LOG" >&2
  exit 1
}

# The hub cache layout huggingface_hub writes: files as blobs, the snapshot as symlinks to them.
COMMIT=4f1c2e0d9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e
REPO=$WORK/hub/models--MiniMaxAI--MiniMax-M3.1-Flash
mkdir -p "$REPO/blobs" "$REPO/snapshots/$COMMIT" "$REPO/refs"
(cd "$ROOT/models/m3-tiny" && find . -type f | sed 's|^\./||') | while read -r name; do
  blob=$(sha256sum "$ROOT/models/m3-tiny/$name" | cut -c1-64)
  cp "$ROOT/models/m3-tiny/$name" "$REPO/blobs/$blob"
  # A file in a subfolder (dspark/) links up one more level, as the hub writes it.
  up=$(printf '%s' "$name" | sed 's|[^/]*/|../|g; s|[^/]*$||')
  mkdir -p "$(dirname "$REPO/snapshots/$COMMIT/$name")"
  ln -s "../../${up}blobs/$blob" "$REPO/snapshots/$COMMIT/$name"
done
[ -f "$REPO/snapshots/$COMMIT/dspark/config.json" ] || fail "m3-tiny has no dspark/ draft to serve with"
printf '%s' "$COMMIT" >"$REPO/refs/main"

# The guide's quickstart, on the CPU; a short context keeps its requests (no max_tokens) quick.
HF_HUB_CACHE=$WORK/hub HF_HUB_OFFLINE=1 "$BIN" serve --trust-remote-code \
  --model-path "$MODEL" --revision "${COMMIT:0:12}" \
  --reasoning-parser minimax-m3 --tool-call-parser minimax-m3 --tp 4 \
  --moe-runner-backend flashinfer_trtllm_routed --speculative-algorithm DSPARK \
  --speculative-use-block-verification \
  --cuda-graph-backend-prefill breakable --chunked-prefill-size 32768 --max-running-requests 128 \
  --cuda-graph-max-bs-decode 128 --mem-fraction-static 0.8 --tokenizer-worker-num 8 \
  --host 127.0.0.1 --port 0 --context-length 512 >"$LOG" 2>&1 &
SERVER_PID=$!
PORT=
for _ in $(seq 1 600); do
  PORT=$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\).*|\1|p' "$LOG" | head -n1)
  [ -n "$PORT" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || fail "the server exited"
  sleep 0.1
done
[ -n "$PORT" ] || fail "the server did not report its port"
BASE=http://127.0.0.1:$PORT
for _ in $(seq 1 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || fail "the server exited while loading"
  sleep 0.1
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] || fail "the model did not load"
grep -q "model $MODEL at revision $COMMIT" "$LOG" || fail "the startup log does not name the revision"
for flag in --trust-remote-code --moe-runner-backend --cuda-graph-backend-prefill \
            --cuda-graph-max-bs-decode; do
  grep -q "note: $flag" "$LOG" || fail "no startup note for the inert flag $flag"
done
# The startup report: weights, layout, KV cache sized by the guide's --mem-fraction-static (on the
# CPU: of the available memory, capped at what 128 running requests of 512 tokens can hold),
# the draft and the ready line with the served name.
for line in "m3serve: weights: .* per rank" "m3serve: layout: 4 CPU ranks in this process over Gloo (tp 4" \
            "KV cache: kv dtype float32 .*, --mem-fraction-static 0.8 of .* per device, capped at what 128 running requests of 512 tokens can hold); context length 512" \
            "m3serve: draft: the checkpoint's dspark/ draft" "m3serve: ready: serving '$MODEL' on http://127.0.0.1:$PORT"; do
  grep -q -- "$line" "$LOG" || fail "no startup report line matching: $line"
done
echo "ok the guide's quickstart: ready, revision $COMMIT, a note for each inert flag, the report"

# Runs a JS assertion on a response body (JSON in $WORK/body): `node` is what the e2e tests use.
check() {
  local what=$1 expr=$2
  node -e "
    const fs = require('fs');
    const r = JSON.parse(fs.readFileSync('$WORK/body', 'utf8'));
    if (!($expr)) { console.error('$what: ' + JSON.stringify(r)); process.exit(1); }
  " || fail "$what"
}

# (a) Plain text chat.
code=$(curl -s -o "$WORK/body" -w '%{http_code}' "$BASE/v1/chat/completions" \
  -H "Content-Type: application/json" \
  -d '{
    "model": "'"$MODEL"'",
    "messages": [
      {"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "Who won the world series in 2020?"}
    ]
  }')
[ "$code" = 200 ] || { cat "$WORK/body" >&2; fail "(a) status $code"; }
check "(a) choices[0].message" "r.object === 'chat.completion' && r.choices[0].message.role === 'assistant' && typeof r.choices[0].message.content === 'string' && r.usage.completion_tokens > 0"
echo "ok (a) plain chat: 200, finish_reason $(node -e "console.log(JSON.parse(require('fs').readFileSync('$WORK/body','utf8')).choices[0].finish_reason)")"

# (b) Thinking disabled.
code=$(curl -s -o "$WORK/body" -w '%{http_code}' "$BASE/v1/chat/completions" \
  -H "Content-Type: application/json" \
  -d '{
    "model": "'"$MODEL"'",
    "messages": [
      {"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "Who won the world series in 2020?"}
    ],
    "thinking": {"type": "disabled"}
  }')
[ "$code" = 200 ] || { cat "$WORK/body" >&2; fail "(b) status $code"; }
check "(b) no reasoning_content" "r.choices[0].message.role === 'assistant' && !r.choices[0].message.reasoning_content && typeof r.choices[0].message.content === 'string'"
echo "ok (b) thinking disabled: 200, no reasoning_content"

# (c) reasoning_effort low.
code=$(curl -s -o "$WORK/body" -w '%{http_code}' "$BASE/v1/chat/completions" \
  -H "Content-Type: application/json" \
  -d '{
    "model": "'"$MODEL"'",
    "messages": [
      {"role": "user", "content": "Who won the world series in 2020?"}
    ],
    "reasoning_effort": "low"
  }')
[ "$code" = 200 ] || { cat "$WORK/body" >&2; fail "(c) status $code"; }
check "(c) choices[0].message" "r.choices[0].message.role === 'assistant'"
echo "ok (c) reasoning_effort low: 200"

# (d) An image part: a clear 400 OpenAI error naming the image part.
code=$(curl -s -o "$WORK/body" -w '%{http_code}' "$BASE/v1/chat/completions" \
  -H "Content-Type: application/json" \
  -d '{
    "model": "'"$MODEL"'",
    "messages": [
      {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "text", "text": "Describe this image."}
      ]}
    ]
  }')
[ "$code" = 400 ] || { cat "$WORK/body" >&2; fail "(d) status $code, expected 400"; }
check "(d) OpenAI error object" "r.error && r.error.type === 'invalid_request_error' && /allowed-media-domains/.test(r.error.message) && r.error.param.startsWith('messages[0].content[0]')"
echo "ok (d) image input: 400 $(node -e "const e=JSON.parse(require('fs').readFileSync('$WORK/body','utf8')).error; console.log(e.code + ': ' + e.message)")"

# Still healthy, still serving.
[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] || fail "/health after the requests"
kill -0 "$SERVER_PID" 2>/dev/null || fail "the server died"
echo "ok health 200 after the guide's requests"
# The draft drafted: the speculative counters moved.
curl -s "$BASE/metrics" >"$WORK/metrics"
drafted=$(sed -n 's/^m3serve:spec_draft_tokens_total{[^}]*} \([0-9.e+]*\).*/\1/p' "$WORK/metrics" | head -n1)
accepted=$(sed -n 's/^m3serve:spec_accepted_tokens_total{[^}]*} \([0-9.e+]*\).*/\1/p' "$WORK/metrics" | head -n1)
node -e "process.exit(Number('$drafted') > 0 ? 0 : 1)" || fail "no drafted tokens in /metrics ('$drafted')"
echo "ok DSPARK: $drafted tokens drafted, $accepted accepted"
