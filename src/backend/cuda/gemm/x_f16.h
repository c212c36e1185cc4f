// Activations for the tensor-core GEMVs (kMmaRing, kMmaDirect; gemv_mma.cuh), whose operands are
// f16: each bf16 row times a power of two 2^s chosen per row so its largest magnitude lands in
// [2^14, 2^15) (every bf16 value of the row is then exactly an f16, down to 2^-31 of the largest;
// nothing overflows), with inv_scale[r] = 2^-s. For rows whose producer does not write this form itself
// (add_rms_norm can; the attention output cannot: a row spans many CTAs). This header includes no
// CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct XToF16Params {
  const uint16_t* x = nullptr;  // [rows, ldx] bf16
  int64_t ldx = 0;
  int64_t rows = 0, k = 0;      // k % 8 == 0
  uint16_t* out = nullptr;      // [rows, ldo] f16 bits
  int64_t ldo = 0;
  float* inv_scale = nullptr;   // [rows]
};

Status launch_x_to_f16(const XToF16Params& p, CUstream_st* stream);

}  // namespace m3::cuda
