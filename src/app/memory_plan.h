// How a model's memory is planned before it loads, as SGLang plans it: --mem-fraction-static F
// bounds the static part (weights + KV pool) to F of each device's memory, and the KV pool is what
// remains after the weights and the part of the step's working memory that does not fit in the
// other 1 - F. Plain arithmetic on numbers the caller measures or reads (device memory, the
// model's shapes), so that every case, including devices this machine does not have, is
// unit-tested (tests/app/memory_plan_test.cpp). docs/memory.md explains the rules for users.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "loader/model_config.h"
#include "loader/vision_config.h"
#include "quant/kv_quant.h"

namespace m3::app {

// How the weights are held in device memory.
enum class WeightStorage {
  kCheckpointFormats,  // the real-shape CUDA path: MXFP8 linears, NVFP4 experts, BF16 elsewhere
  kFloat32,            // the float32 reference path (CPU, or the float32 CUDA backend)
};

// Bytes of the text model's weights on one of `ranks` devices (--tp) of which `ep` (--ep, dividing
// ranks) are expert-parallel ranks (model/minimax_m3/tensor_parallel.h). Attention heads and MLP
// columns are split over the ranks (K/V and index heads are replicated where there are fewer
// heads than ranks); each rank holds E/ep routed experts, each with 1/(ranks/ep) of its
// intermediate columns; norms, the router and the index key projection are replicated. The
// vocabulary rows of the embedding and head are split on the GPU path; the float32 path splits the
// head's and keeps the embedding whole. Checkpoint formats: MXFP8 1 + 1/32 bytes per element (E4M3 codes and an E8M0
// scale per 32), NVFP4 0.5 + 1/16 (E2M1 codes and an E4M3 scale per 16) and a global scale per
// tensor, BF16 2. With attention data parallelism over `dp` groups (dividing ranks) a rank holds
// its group's share of the attention heads: they split over ranks / dp ranks, the rest as above.
int64_t weight_bytes_per_device(const MiniMaxM3Config& cfg, WeightStorage storage, int ranks,
                                int ep = 1, int dp = 1);

// Bytes of one KV page (page_size tokens, every layer) on one of `ranks` devices: K and V of the
// rank's KV heads in `kv_element_bytes` (2 bf16, 1 fp8, 4 the float32 path), the index keys of
// the sparse layers in `index_element_bytes` (one head, on every rank). With attention data
// parallelism over `dp_groups` groups (dividing ranks) a rank holds its group's pool: the KV heads
// are split over the group's ranks / dp_groups ranks, and the pool's pages are per group.
int64_t kv_bytes_per_page_per_device(const MiniMaxM3Config& cfg, int ranks,
                                     double kv_element_bytes, double index_element_bytes,
                                     int dp_groups = 1);

// The same in a --kv-cache-dtype's storage, scales included (quant/kv_quant.h): float32 4 bytes
// per element, bf16 2, fp8_e4m3 1 and a float per page-head, fp4_e2m1 1/2 + 1/16 and a float per
// page-head. MiniMax-M3.1-Flash on one device: 138,240 bytes per token in bf16, 69,136.875 in
// fp8_e4m3, 38,896.875 in fp4_e2m1.
int64_t kv_bytes_per_page_for_dtype(const MiniMaxM3Config& cfg, int ranks, KvCacheDtype dtype,
                                    int dp_groups = 1);

// The working memory of a step on one device, estimated from the shapes of its buffers: the
// activations of `step_tokens` tokens (a prefill chunk or a decode batch, whichever is larger),
// logits for `logit_rows` rows, and a fixed part (CUDA context, cuBLAS workspace, the attention
// scratch and the dequantised-weight buffer of the prefill GEMMs on the GPU).
int64_t activation_bytes_per_device(const MiniMaxM3Config& cfg, WeightStorage storage, int ranks,
                                    int64_t step_tokens, int64_t logit_rows);

// The DSpark draft (docs/dspark.md), held in float32 next to the target on the CPU path: the
// shape numbers of its config.
struct DraftMemoryShape {
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t vocab = 0, markov_rank = 0, sliding_window = 0;
  int64_t num_target_layers = 0;  // dspark_target_layer_ids: the features are that many hiddens
  bool confidence_head = false, confidence_with_markov = false;
  int64_t context_page_size = 128;  // the draft context cache's page (DSparkContextCache)
};
// The draft's own weights in float32 (its embedding table, lm_head and final norm are the
// target's, counted there): fc, the two norms, the Markov head, the confidence head, and per
// layer the attention and dense MLP projections and their norms.
int64_t draft_weight_bytes(const DraftMemoryShape& d);
// One running sequence's draft context cache: K and V of every draft layer over
// ceil(W / S) + 3 pages of S positions (the sliding window W and the pages a verify may roll
// back into).
int64_t draft_context_bytes_per_sequence(const DraftMemoryShape& d);
// The captured target hidden states kept with one KV page of `page_size` tokens so that
// speculative requests can be served from the prefix cache (engine/draft_feature_store.h).
int64_t draft_feature_bytes_per_kv_page(const DraftMemoryShape& d, int32_t page_size);

// The vision tower and projector as CudaVisionTower holds them on the GPU: bf16 matrices (the
// patch embedding, q|k|v, o and the MLP of every layer, the projector and the merge MLP) and
// float32 norms and biases. MiniMax-M3's tower: 1.73 GB.
int64_t vision_tower_gpu_bytes(const VisionConfig& v);

struct MemoryPlanInput {
  std::string device_name;          // "cuda" or "cpu", for the messages
  int64_t device_memory_bytes = 0;  // per device: the CUDA runtime's total, or MemAvailable (CPU)
  int ranks = 1;                    // devices the model is split over
  double mem_fraction_static = 0;   // (0, 1]; 0: not given
  double default_mem_fraction = 0;  // used when not given; 0: no fraction planning by default
  int64_t default_kv_cache_bytes = 0;  // the pool when neither a fraction nor a size is given
  int64_t kv_cache_bytes = 0;          // --kv-cache-bytes per device; 0: planned
  int64_t weight_bytes = 0;            // per device
  int64_t activation_bytes = 0;        // per device
  int64_t kv_bytes_per_page = 0;       // per device
  int32_t page_size = 0;
  int32_t max_context_length = 0;  // the model's max_position_embeddings
  int32_t context_length = 0;      // --context-length; 0: the model's maximum, capped to what fits
  // With a fraction: cap the pool at what `max_running_requests` requests of the context length
  // can ever hold (0: no cap). The CPU pool is allocated and zeroed up front, so a pool that no
  // request can use costs memory and start-up time.
  int32_t cap_to_running_requests = 0;
  // With a fraction: the most the pool may take (0: no limit). After a profile step this is the
  // memory the step left free less a headroom: the fraction's rule lets the working memory use
  // all of (1 - F), which leaves nothing for allocation rounding or a later step's growth.
  int64_t free_bytes_limit = 0;
};

struct MemoryPlan {
  int64_t kv_cache_bytes = 0;  // per device
  int64_t pages = 0;
  int64_t max_tokens = 0;  // pages * page_size
  int32_t context_length = 0;
  int64_t reserve_bytes = 0;  // working memory counted inside the fraction
  std::string sized_by;       // how the pool was sized, for the startup report
  std::vector<std::string> warnings;
};

// The plan, or invalid_argument naming the numbers and what to change: a pool that cannot hold
// one page, weights that do not fit, or an explicit --context-length the pool cannot hold.
Result<MemoryPlan> plan_memory(const MemoryPlanInput& in);

// MemAvailable from /proc/meminfo (bytes), or `meminfo_text` when given (tests).
Result<int64_t> available_host_memory(const std::string& meminfo_text = "");

// "12.3 GB" (decimal units, as GPU memory is sold).
std::string format_bytes(int64_t bytes);

}  // namespace m3::app
