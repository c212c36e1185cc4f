// MXFP8 weights from the checkpoint's row-major order into the mma layout the kMmaDirect GEMV
// streams (quant/mxfp8_mma_layout.h), on the GPU. This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "quant/mxfp8_mma_layout.h"

struct CUstream_st;

namespace m3::cuda {

// dst = `groups` matrices [N, K] of src in the mma layout (out of place, the same size; bitwise
// mxfp8_mma::pack_matrix). Requires mxfp8_mma::fits(n, k, tiling).
Status launch_mxfp8_mma_repack(const uint8_t* src, uint8_t* dst, int64_t groups, int64_t n,
                               int64_t k, mxfp8_mma::Tiling tiling, CUstream_st* stream);

// The same in place, one matrix at a time through a temporary device buffer of one matrix
// (allocated and freed here; synchronises the stream). For load time.
Status mxfp8_mma_repack_in_place(uint8_t* w, int64_t groups, int64_t n, int64_t k,
                                 mxfp8_mma::Tiling tiling, CUstream_st* stream);

}  // namespace m3::cuda
