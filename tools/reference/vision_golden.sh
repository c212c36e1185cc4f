#!/usr/bin/env bash
# Builds the vision golden fixture on the GPU machine (transformers minimax_m3_vl reference):
#   $OUT/vision_golden.tgz   tests/fixtures/vision_golden/... (unpack at the repository root)
#   $OUT/vision_golden.log   everything vision_golden.py printed (smoke run first, then the full run)
# Usage: OUT=/some/dir bash tools/reference/vision_golden.sh
#        OUT=/some/dir PROCESSOR_ONLY=1 bash tools/reference/vision_golden.sh
#          (the image set and the processor's files only, a few seconds; the model part of the
#           fixture is kept: unpack over it)
# The --smoke run (a few images, a 2-layer real-shape tower) goes first; a failure there stops
# before the full run. Hard limits: 120 s (smoke) + 400 s (full).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
mkdir -p "$OUT"
LOG=$OUT/vision_golden.log
WORK=$(mktemp -d)
{
  echo "== vision_golden $(date -u) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 || true
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
} >>"$LOG" 2>&1
DEVICE=cpu
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >>"$LOG" 2>&1; then
  DEVICE=cuda
fi
rc=0
if [ -z "${PROCESSOR_ONLY:-}" ]; then
  echo "== smoke: --device $DEVICE" | tee -a "$LOG"
  PYTHONUNBUFFERED=1 timeout 120 python3 -u tools/reference/vision_golden.py --smoke \
    --out "$WORK/smoke" --device "$DEVICE" >>"$LOG" 2>&1
  rc=$?
  echo "== smoke exit $rc after ${SECONDS}s" | tee -a "$LOG"
fi
if [ "$rc" -eq 0 ]; then
  mkdir -p "$WORK/tests/fixtures"
  PYTHONUNBUFFERED=1 timeout 400 python3 -u tools/reference/vision_golden.py \
    ${PROCESSOR_ONLY:+--processor-only} \
    --out "$WORK/tests/fixtures/vision_golden" --device "$DEVICE" >>"$LOG" 2>&1
  rc=$?
  echo "== full exit $rc after ${SECONDS}s" | tee -a "$LOG"
  [ -d "$WORK/tests/fixtures/vision_golden" ] && tar czf "$OUT/vision_golden.tgz" -C "$WORK" tests/fixtures/vision_golden
fi
ls -la "$OUT" >>"$LOG"
# Tracebacks and the summary lines, last.
grep -E "Traceback|Error|FAILED|^\[ *[0-9.]+s\] (====|[a-z_0-9]+ +[0-9]+x[0-9]+|summary|vision golden|processor golden|step )|^== " "$LOG" | tail -n 60
rm -rf "$WORK"
exit $rc
