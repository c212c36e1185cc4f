#!/usr/bin/env bash
# Train m3-tiny on the GPU machine in one go and pack the results into $OUT.
#   bash tools/train_tiny/run_on_device.sh            (from the repository root, $OUT set by the device tool)
# Environment: TRAIN_SECONDS (default 360), EVAL_SECONDS (default 90), N_TRAIN (default 400000),
# EVAL_BATCH (default 150), M3TINY_NO_FAST=1 (train with the transformers classes, the old slow path),
# EXTRA_ARGS (more train.py arguments), INIT_FROM (continue from this m3-tiny folder, e.g. models/m3-tiny).
# $OUT receives train.log, last_run.json and m3tiny.tar.gz (split into m3tiny.tar.gz.part-* when over
# 15 MiB). Unpack at the repository root:
#   cat m3tiny.tar.gz* | tar -xzf -       (gives models/m3-tiny/ and tests/fixtures/m3_tiny/)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/m3tiny_out}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
echo "repo $(pwd) work $WORK out $OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | head -3

python3 tools/train_tiny/train.py \
  --train-seconds "${TRAIN_SECONDS:-360}" \
  --eval-seconds "${EVAL_SECONDS:-90}" \
  --eval-batch "${EVAL_BATCH:-150}" \
  --n-train "${N_TRAIN:-400000}" \
  --out-model "$WORK/models/m3-tiny" \
  --out-fixtures "$WORK/tests/fixtures/m3_tiny" \
  --report "$WORK/tools/train_tiny/last_run.json" ${EXTRA_ARGS:-} ${INIT_FROM:+--init-from "$INIT_FROM"} 2>&1 | tee "$OUT/train.log"
rc=${PIPESTATUS[0]}
echo "train.py exit code $rc" | tee -a "$OUT/train.log"

cp "$WORK/tools/train_tiny/last_run.json" "$OUT/" 2>/dev/null
( cd "$WORK" && tar -czf "$OUT/m3tiny.tar.gz" $(ls -d models tests tools 2>/dev/null) )
size=$(stat -c %s "$OUT/m3tiny.tar.gz")
if [ "$size" -gt $((15 * 1024 * 1024)) ]; then
  ( cd "$OUT" && split -b 15M m3tiny.tar.gz m3tiny.tar.gz.part- && rm m3tiny.tar.gz )
fi
ls -la "$OUT" | tee -a "$OUT/train.log"
exit "$rc"
