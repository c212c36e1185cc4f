// The float32 DSpark draft on the CudaBackend (the target's float32 path on a GPU, any shape, e.g.
// models/m3-tiny with --device cuda): DSparkDraft's backend ops run on the CudaBackend as they do
// on the CPU; only its block attention, which is host code there, needs a kernel, and this is it
// (backend/cuda/dspark/block_attention.h, float32 variant) behind dspark::BlockAttentionFn.
#pragma once

#include "model/minimax_m3/dspark/dspark_attention.h"

namespace m3 {
class CudaBackend;
}

namespace m3::minimax_m3 {

// The block attention on `backend`'s stream (pointers are that backend's device memory).
dspark::BlockAttentionFn cuda_dspark_block_attention_f32(CudaBackend* backend);

}  // namespace m3::minimax_m3
