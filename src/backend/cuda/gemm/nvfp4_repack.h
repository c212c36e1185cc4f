// NVFP4 weights from the checkpoint's row-major order into the mma layout the tensor-core decode
// GEMV reads faster (quant/nvfp4_mma_layout.h), on the GPU. This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "quant/nvfp4_mma_layout.h"

struct CUstream_st;

namespace m3::cuda {

// dst = `groups` matrices [N, K/2 bytes] of src in the mma layout (out of place, the same size;
// bitwise nvfp4_mma::pack_matrix). Requires nvfp4_mma::fits(n, k, tiling).
Status launch_nvfp4_mma_repack(const uint8_t* src, uint8_t* dst, int64_t groups, int64_t n,
                               int64_t k, nvfp4_mma::Tiling tiling, CUstream_st* stream);

// The same in place, one matrix at a time through a temporary device buffer of one matrix
// (allocated and freed here; synchronises the stream). For load time.
Status nvfp4_mma_repack_in_place(uint8_t* w, int64_t groups, int64_t n, int64_t k,
                                 nvfp4_mma::Tiling tiling, CUstream_st* stream);

}  // namespace m3::cuda
