#!/usr/bin/env bash
# Train m3-tiny on the GPU machine in one go and pack the results into $OUT.
#   bash tools/train_tiny/run_on_device.sh [--smoke]   (from the repository root, $OUT set by the device tool)
# Environment: TRAIN_SECONDS (default 360), EVAL_SECONDS (default 90), N_TRAIN (default 400000),
# EVAL_BATCH (default 150), M3TINY_NO_FAST=1 (train with the transformers classes, the old slow path),
# EXTRA_ARGS (more train.py arguments), INIT_FROM (continue from this m3-tiny folder, e.g. models/m3-tiny),
# VISION=1 (the vision-and-tools round: train.py --vision, image questions and generated tools in the
# corpus, a vision tower trained with the text model, held-out image and tool-schema evaluations; every
# training batch is drawn fresh by data workers (fresh_data.py), N_TRAIN then only sizes the small fixed
# corpus used for checks, capped at 20000), FRESH=0 (with VISION=1: the fixed corpus of N_TRAIN
# conversations instead, as before fresh_data.py).
# $OUT receives train.log, last_run.json and m3tiny.tar.gz (split into m3tiny.tar.gz.part-* when over
# 15 MiB). Unpack at the repository root:
#   cat m3tiny.tar.gz* | tar -xzf -       (gives models/m3-tiny/ and tests/fixtures/m3_tiny/)
# --smoke (or SMOKE=1): the whole pipeline with tiny sizes (3000 conversations, 5 s of training, 4 items
# per evaluation task, one golden case) in well under a minute; writes only $OUT/smoke.log and
# $OUT/smoke_last_run.json and exits non-zero on any failure. Run it first in the same device call:
#   bash tools/train_tiny/run_on_device.sh --smoke && bash tools/train_tiny/run_on_device.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/m3tiny_out}"
mkdir -p "$OUT"
SMOKE="${SMOKE:-0}"
for a in "$@"; do
  case "$a" in
    --smoke) SMOKE=1 ;;
    *) echo "run_on_device.sh: unknown argument '$a' (only --smoke)" >&2; exit 2 ;;
  esac
done
WORK="$(mktemp -d)"
echo "repo $(pwd) work $WORK out $OUT smoke $SMOKE vision ${VISION:-0} fresh ${FRESH:-1}"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | head -3

ROUND_ARGS=()
[ "${VISION:-0}" = 1 ] && ROUND_ARGS+=(--vision)
[ "${VISION:-0}" = 1 ] && [ "${FRESH:-1}" = 0 ] && ROUND_ARGS+=(--no-fresh)
if [ "$SMOKE" = 1 ]; then
  LOG="$OUT/smoke.log"
  ROUND_ARGS+=(--eval-limit 4 --golden-limit 1 --golden-new-tokens 8 --eval-max-new 48)
  TRAIN_SECONDS="${SMOKE_TRAIN_SECONDS:-5}" EVAL_SECONDS=20 N_TRAIN=3000 EVAL_BATCH=16
else
  LOG="$OUT/train.log"
fi

python3 tools/train_tiny/train.py \
  --train-seconds "${TRAIN_SECONDS:-360}" \
  --eval-seconds "${EVAL_SECONDS:-90}" \
  --eval-batch "${EVAL_BATCH:-150}" \
  --n-train "${N_TRAIN:-400000}" \
  --out-model "$WORK/models/m3-tiny" \
  --out-fixtures "$WORK/tests/fixtures/m3_tiny" \
  --report "$WORK/tools/train_tiny/last_run.json" "${ROUND_ARGS[@]}" ${EXTRA_ARGS:-} \
  ${INIT_FROM:+--init-from "$INIT_FROM"} 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
echo "train.py exit code $rc" | tee -a "$LOG"

if [ "$SMOKE" = 1 ]; then
  cp "$WORK/tools/train_tiny/last_run.json" "$OUT/smoke_last_run.json" 2>/dev/null
  if [ "$rc" = 0 ] && grep -q "WARNING" "$LOG"; then
    echo "smoke: train.py finished with warnings (see $LOG); the full run may still be fine" | tee -a "$LOG"
  fi
  rm -rf "$WORK"
  exit "$rc"
fi
cp "$WORK/tools/train_tiny/last_run.json" "$OUT/" 2>/dev/null
( cd "$WORK" && tar -czf "$OUT/m3tiny.tar.gz" $(ls -d models tests tools 2>/dev/null) )
size=$(stat -c %s "$OUT/m3tiny.tar.gz")
if [ "$size" -gt $((15 * 1024 * 1024)) ]; then
  ( cd "$OUT" && split -b 15M m3tiny.tar.gz m3tiny.tar.gz.part- && rm m3tiny.tar.gz )
fi
ls -la "$OUT" | tee -a "$LOG"
exit "$rc"
