// The tensor-core split kernel of the block-sparse decode attention (sparse_decode_mma.cu),
// launched by launch_sparse_decode (sparse_decode.cu) for one split per selected block when
// SparseDecodeParams::mma is set; it writes the partial states the combine merges. The launcher
// has checked the shapes and alignments.
#pragma once

#include "backend/cuda/attention/sparse_decode.h"

namespace m3::cuda {

Status launch_sparse_decode_mma(const SparseDecodeParams& p, CUstream_st* stream);

// The clustered form (SparseDecodeParams::cluster_combine): the split and the merge in one
// launch, writing p.out (no partial buffers, no combine). Needs top_k == 16 and a GPU that can
// schedule a 16-CTA cluster of it: sparse_decode_mma_cluster_fits.
bool sparse_decode_mma_cluster_fits(const SparseDecodeParams& p);
// Candidate blocks up to which the clustered kernel selects from SparseDecodeParams::block_scores.
constexpr int64_t kClusterSelectMax = 1024;
Status launch_sparse_decode_mma_cluster(const SparseDecodeParams& p, CUstream_st* stream);

}  // namespace m3::cuda
