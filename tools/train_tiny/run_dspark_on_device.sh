#!/usr/bin/env bash
# Train the DSpark draft of m3-tiny on the GPU machine and pack the results into $OUT.
#   bash tools/train_tiny/run_dspark_on_device.sh      (from the repository root, $OUT set by the device tool)
# Environment: TRAIN_SECONDS (default 240, split over the two capture conventions), TARGET_DIR (default
# models/m3-tiny: the target to draft for, e.g. a freshly retrained one), EXTRA_ARGS (more
# train_dspark.py arguments). A --smoke run (whole pipeline, tiny sizes) goes first; a failure there
# stops the script. $OUT receives dspark_train.log and dspark.tar.gz; unpack at the repository root:
#   tar -xzf dspark.tar.gz     (gives models/m3-tiny/dspark/, tests/fixtures/m3_tiny/dspark_parity.json,
#                               tools/train_tiny/dspark_last_run.json)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/dspark_out}"
TARGET_DIR="${TARGET_DIR:-models/m3-tiny}"
mkdir -p "$OUT"
LOG="$OUT/dspark_train.log"
WORK="$(mktemp -d)"
echo "repo $(pwd) target $TARGET_DIR work $WORK out $OUT" | tee "$LOG"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | head -3 | tee -a "$LOG"

python3 tools/train_tiny/train_dspark.py --smoke --target-dir "$TARGET_DIR" \
  --out-dir "$WORK/smoke/dspark" --fixture "$WORK/smoke/dspark_parity.json" \
  --report "$WORK/smoke/report.json" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "smoke exit code $rc" | tee -a "$LOG"
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi

python3 tools/train_tiny/train_dspark.py --train-seconds "${TRAIN_SECONDS:-240}" --target-dir "$TARGET_DIR" \
  --out-dir "$WORK/models/m3-tiny/dspark" \
  --fixture "$WORK/tests/fixtures/m3_tiny/dspark_parity.json" \
  --report "$WORK/tools/train_tiny/dspark_last_run.json" ${EXTRA_ARGS:-} 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "train_dspark.py exit code $rc" | tee -a "$LOG"
( cd "$WORK" && tar -czf "$OUT/dspark.tar.gz" $(ls -d models tests tools 2>/dev/null) )
ls -la "$OUT" | tee -a "$LOG"
exit "$rc"
