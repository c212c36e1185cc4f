// Random ("dummy") weights generated on the GPU in the real storage formats, for
// `--load-format dummy` and the benchmarks: memory traffic and kernels are exactly those of the
// real checkpoint. Values come from a counter-based hash (splitmix64 of seed and index), so a
// buffer's contents depend only on (kind, seed, index) and never on the launch shape.
//
// Kinds and what they write:
//   kBf16Normal   bf16, approximately N(0, scale^2) (sum of uniforms)
//   kF32Normal    float32, same distribution
//   kE4m3Codes    MXFP8/E4M3 codes: any finite code (0x7F / 0xFF NaN never written)
//   kE8m0Scales   E8M0 exponents s = 127 - 8 - (h % 4): block scales 2^-8 .. 2^-11, like real
//                 weights of magnitude ~0.01-0.1
//   kE2m1Packed   NVFP4 packed codes: any byte
//   kE4m3Scales   NVFP4 block scales: positive E4M3 codes in [0x30, 0x6F] (0.5 .. 120)
// This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

enum class DummyKind : int {
  kBf16Normal,
  kF32Normal,
  kE4m3Codes,
  kE8m0Scales,
  kE2m1Packed,
  kE4m3Scales,
};

// Fills `count` elements (bytes for the 8-bit kinds) at `dst`.
Status fill_dummy(void* dst, int64_t count, DummyKind kind, uint64_t seed, float scale,
                  CUstream_st* stream);

}  // namespace m3::cuda
