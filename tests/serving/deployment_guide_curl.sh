#!/usr/bin/env bash
# The MiniMax deployment guide's three curl requests against `m3serve serve` on the bundled
# m3-tiny, sent with curl as the guide sends them (only the host, port and model name differ:
# the guide's model name is not served here, and an unknown model is a 404 by design):
#   (a) a plain text chat            -> 200 with choices[0].message
#   (b) the same, thinking disabled  -> 200, no reasoning_content in the message
#   (c) an image_url content part    -> a 400 OpenAI error object (image input not available /
#                                       the domain not allowed), never a crash
# then /health is still 200. Usage: deployment_guide_curl.sh <m3serve binary>
set -euo pipefail

BIN=${1:-${M3SERVE_BIN:-build/bin/m3serve}}
MODEL=m3-tiny
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

# A short context keeps the guide's requests (no max_tokens) quick on the CPU.
"$BIN" serve --host 127.0.0.1 --port 0 --context-length 512 >"$LOG" 2>&1 &
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

# (c) An image part: a clear 400 OpenAI error naming the image part.
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
[ "$code" = 400 ] || { cat "$WORK/body" >&2; fail "(c) status $code, expected 400"; }
check "(c) OpenAI error object" "r.error && r.error.type === 'invalid_request_error' && /image|domain/i.test(r.error.message) && r.error.param.startsWith('messages[0].content[0]')"
echo "ok (c) image input: 400 $(node -e "const e=JSON.parse(require('fs').readFileSync('$WORK/body','utf8')).error; console.log(e.code + ': ' + e.message)")"

# Still healthy, still serving.
[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] || fail "/health after (c)"
kill -0 "$SERVER_PID" 2>/dev/null || fail "the server died"
echo "ok health 200 after the three requests"
