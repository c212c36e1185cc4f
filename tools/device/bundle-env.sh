# Sourced (from the repository root) by the scripts that run on the GPU machine: unpacks the
# binaries tools/device/bundle.sh gathered (carried compressed as .device/cuda.tar.xz: a call's
# tree is limited to 64 MiB) into .device/cuda, or $BIN_DIR, and puts that folder on
# LD_LIBRARY_PATH; sets B to it. The archive is unpacked on every call that carries it: a warm
# machine keeps ignored folders between calls, so one left there may hold older binaries.
B=${BIN_DIR:-.device/cuda}
if [ -f "$B.tar.xz" ]; then
  rm -rf "$B" && xz -dc "$B.tar.xz" | tar -C "$(dirname "$B")" -xf - ||
    { echo "cannot unpack $B.tar.xz" >&2; exit 1; }
fi
[ -f "$B/BUILD_INFO" ] ||
  { echo "no $B/BUILD_INFO: run tools/device/bundle.sh here and carry .device/cuda.tar.xz" >&2; exit 1; }
export LD_LIBRARY_PATH="$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
