#!/usr/bin/env bash
# Runs on the GPU machine: the same commands through two bundles of tools/device/bundle.sh (a
# "before" build and the current one) and compares their outputs byte for byte, then times the
# decode step of each, alternating, in the same call. For a change that must keep results bitwise
# and speed unchanged (a refactoring, a build flag).
#   here:  (in a checkout of the old commit) tools/device/bundle.sh; mv .device/cuda.tar.xz
#          to this checkout's .device/before.tar.xz; then tools/device/bundle.sh here
#   there: bash tools/device/compare-builds.sh
#          carry: [".device/before.tar.xz", ".device/cuda.tar.xz"]
# Compared: m3serve score (every position's argmax and the last position's logits, printed as
# JSON) at the MiniMax-M3.1-Flash shapes with 2 dummy layers, one prefill chunk of 3000 tokens
# (the indexer selects blocks) and one-token chunks (the decode path and its CUDA graphs);
# m3serve generate at temperature 0 and 1 (sampling on the GPU) on the same model and on the
# bundled m3-tiny. Files back in $OUT: compare.log (everything), outputs.tsv.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?OUT must be set}"
LOG=$OUT/compare.log
note() { echo "$*" | tee -a "$LOG"; }
unpack() {  # archive dir
  rm -rf "$2" && mkdir -p "$2" && xz -dc "$1" | tar -C "$2" --strip-components=1 -xf - ||
    { echo "cannot unpack $1" >&2; exit 1; }
}
[ -f .device/before.tar.xz ] && [ -f .device/cuda.tar.xz ] ||
  { echo "carry .device/before.tar.xz and .device/cuda.tar.xz" >&2; exit 2; }
unpack .device/before.tar.xz .device/b0
unpack .device/cuda.tar.xz .device/b1
note "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
note "before: $(head -1 .device/b0/BUILD_INFO)   after: $(head -1 .device/b1/BUILD_INFO)"

ids() {  # n: n token ids of a fixed pseudo-random sequence below 150000
  awk -v n="$1" 'BEGIN { x = 12345; for (i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648;
    printf "%s%d", (i ? "," : ""), 1000 + x % 149000 } }'
}
LONG=$(ids 3000)
SHORT=$(ids 40)
DUMMY=(--load-format dummy --num-layers 2 --device cuda)
CASES=(
  "score-prefill-3000|score ${DUMMY[*]} --prompt-ids $LONG"
  "score-one-token-chunks|score ${DUMMY[*]} --prefill-chunk 1 --prompt-ids $SHORT"
  "generate-t0|generate ${DUMMY[*]} --max-tokens 24 --ignore-eos --prompt-ids $LONG"
  "generate-t1|generate ${DUMMY[*]} --max-tokens 24 --ignore-eos --temperature 1 --seed 5 --prompt-ids $LONG"
  "tiny-t0|generate --model-path models/m3-tiny --device cuda --max-tokens 24 --prompt-ids 4066,1,2,3,4,5"
  "tiny-t1|generate --model-path models/m3-tiny --device cuda --max-tokens 24 --temperature 1 --seed 3 --prompt-ids 4066,1,2,3,4,5"
)
printf 'case\tbefore_sha\tafter_sha\tsame\tbytes\n' >"$OUT/outputs.tsv"
SUMMARY=()
for c in "${CASES[@]}"; do
  name=${c%%|*}
  read -r -a args <<<"${c#*|}"
  for v in 0 1; do
    export LD_LIBRARY_PATH="$PWD/.device/b$v"
    timeout 180 ".device/b$v/m3serve" "${args[@]}" >"/tmp/out.$name.$v" 2>>"$LOG"
    echo "$name build $v rc=$?" >>"$LOG"
  done
  s0=$(sha256sum <"/tmp/out.$name.0" | cut -c1-16)
  s1=$(sha256sum <"/tmp/out.$name.1" | cut -c1-16)
  bytes=$(wc -c <"/tmp/out.$name.1")
  same=no
  [ "$bytes" -gt 0 ] && cmp -s "/tmp/out.$name.0" "/tmp/out.$name.1" && same=yes
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$s0" "$s1" "$same" "$bytes" >>"$OUT/outputs.tsv"
  SUMMARY+=("$(printf '%-24s same=%-3s %8s bytes  %s' "$name" "$same" "$bytes" "$(head -c 100 "/tmp/out.$name.1")")")
done

# Decode step time, 8 layers (the bench's per-layer split needs its 1/3/8-layer models; this is
# the A/B form): before, after, before, after.
for round in 1 2; do
  for v in 0 1; do
    export LD_LIBRARY_PATH="$PWD/.device/b$v"
    echo "== decode bench round $round build $v" >>"$LOG"
    M3_BENCH_LAYERS=8 M3_BENCH_ONLY='1,4096;8,4096;32,4096' timeout 240 \
      ".device/b$v/cuda_model_decode_bench" - >"/tmp/bench.$round.$v" 2>&1
    echo "rc=$?" >>"$LOG"
    cat "/tmp/bench.$round.$v" >>"$LOG"
    SUMMARY+=("bench round $round build $v: $(grep -oE 'B=[0-9]+ ctx=[0-9]+, 8 layers: [0-9.]+ ms' "/tmp/bench.$round.$v" | sed 's/, 8 layers://' | paste -sd';')")
  done
done
{
  echo
  echo "== summary"
  printf '%s\n' "${SUMMARY[@]}"
} | tee -a "$LOG"
