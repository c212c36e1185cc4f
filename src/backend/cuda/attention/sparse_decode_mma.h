// The tensor-core split kernel of the block-sparse decode attention (sparse_decode_mma.cu),
// launched by launch_sparse_decode (sparse_decode.cu) for one split per selected block when
// SparseDecodeParams::mma is set; it writes the partial states the combine merges. The launcher
// has checked the shapes and alignments.
#pragma once

#include "backend/cuda/attention/sparse_decode.h"

namespace m3::cuda {

Status launch_sparse_decode_mma(const SparseDecodeParams& p, CUstream_st* stream);

}  // namespace m3::cuda
