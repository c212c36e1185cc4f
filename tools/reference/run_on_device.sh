#!/usr/bin/env bash
# Builds the golden model fixtures on the GPU machine (transformers reference) and packs them:
#   $OUT/golden.tgz   golden/<fixture>/{config.json,model.safetensors,generation_config.json,
#                     expected.json[,hf_quant_config.json]} and golden/manifest.json
#                     (+ golden_cpu/ when the CUDA run failed and the CPU fallback ran)
#   $OUT/golden.log   everything make_golden.py printed (versions, HF sources, checks, summary)
# Usage: OUT=/some/dir bash tools/reference/run_on_device.sh
# Unpack with: tar xzf golden.tgz && cp -r golden/* tests/fixtures/golden/
# Takes well under a minute normally; hard limits 170 s (CUDA) + 100 s (CPU fallback).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
mkdir -p "$OUT"
LOG=$OUT/golden.log
WORK=$(mktemp -d)
{
  echo "== make_golden $(date -u) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
} >>"$LOG" 2>&1

DEVICE=cpu
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >>"$LOG" 2>&1; then
  DEVICE=cuda
fi
echo "== run 1: --device $DEVICE" >>"$LOG"
PYTHONUNBUFFERED=1 timeout 170 python3 -u tools/reference/make_golden.py \
  --out "$WORK/golden" --device "$DEVICE" >>"$LOG" 2>&1
rc=$?
echo "== run 1 exit $rc after ${SECONDS}s" >>"$LOG"

if [ "$rc" -ne 0 ] && [ "$DEVICE" = cuda ]; then
  # Tells a CUDA-only problem apart from a reference problem; the CUDA output stays primary.
  echo "== run 2 (fallback): --device cpu" >>"$LOG"
  PYTHONUNBUFFERED=1 timeout 100 python3 -u tools/reference/make_golden.py \
    --out "$WORK/golden_cpu" --device cpu >>"$LOG" 2>&1
  echo "== run 2 exit $? after ${SECONDS}s" >>"$LOG"
fi

dirs=()
for d in golden golden_cpu; do [ -d "$WORK/$d" ] && dirs+=("$d"); done
if [ ${#dirs[@]} -gt 0 ]; then
  tar czf "$OUT/golden.tgz" -C "$WORK" "${dirs[@]}"
fi
ls -la "$OUT" >>"$LOG"
echo "== done $(date -u)" >>"$LOG"
# The summary tables are the last lines of each run; show them to the caller.
grep -E "^\[ *[0-9.]+s\] (=====|fixture |[a-z0-9_]+ +(yes|NO) |total size| +[a-z_.]+ +[0-9]+$| +ERROR)|^== " "$LOG" | tail -n 80
rm -rf "$WORK"
exit $rc
