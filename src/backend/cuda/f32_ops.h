// Launchers of the float32 ops behind CudaBackend (the correctness path: the same contracts as
// the Backend parameter structs in backend/backend.h, computed on the GPU in float32). Each
// returns a Status for launch errors; device-side contract violations (a page id out of range)
// cannot throw, so kernels skip such elements and the op tests check the valid ones.
#pragma once

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "core/status.h"

namespace m3::cuda {

Status launch_rms_norm(const RmsNormParams& p, cudaStream_t s);
Status launch_add(const AddParams& p, cudaStream_t s);
Status launch_rope(const RopeParams& p, cudaStream_t s);
Status launch_swiglu_oai(const SwigluOaiParams& p, cudaStream_t s);
Status launch_embedding(const EmbeddingParams& p, cudaStream_t s);
Status launch_gather_rows(const GatherRowsParams& p, cudaStream_t s);
// Float32 caches here; any other --kv-cache-dtype through launch_kv_write_quantised
// (kv/kv_write_quant.cu), the CPU's kv_write bit for bit.
Status launch_kv_write(const KvWriteParams& p, cudaStream_t s);
Status launch_kv_write_quantised(const KvWriteParams& p, cudaStream_t s);
Status launch_router_topk(const RouterTopkParams& p, cudaStream_t s);
// `w13_dev` / `w2_dev`: device arrays of the E expert pointers. `act` [M·K, I] and
// `contrib` [M·K, Hd] are scratch.
Status launch_moe_experts(const MoeExpertsParams& p, const float* const* w13_dev,
                          const float* const* w2_dev, float* act, float* contrib, cudaStream_t s);
// `block_scores` is scratch of T·Hix·num_blocks floats.
Status launch_indexer_topk(const IndexerTopkParams& p, float* block_scores, cudaStream_t s);
// Both read a float32 cache directly and any other --kv-cache-dtype through exact dequantisation
// of each element (kv_load_element), as the CPU does.
Status launch_paged_attention(const PagedAttentionParams& p, cudaStream_t s);

}  // namespace m3::cuda
