// How many KV pages fit in memory: bytes per page from the model's KV layout, then pages from a
// byte budget (CPU) or from SGLang's --mem-fraction-static rule (GPU). Plain arithmetic, no
// device queries: the caller measures device memory and weight bytes.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace m3 {

// Per-token KV storage of one model (m3-architecture.md §3.6). Dense layers store K and V; sparse
// (MSA) layers store K, V and the indexer key, all in the same page.
struct KvLayout {
  int32_t num_dense_layers = 0;
  int32_t num_sparse_layers = 0;
  int32_t num_kv_heads = 0;      // per rank after tensor parallel split
  int32_t head_dim = 0;          // K and V each
  int32_t index_head_dim = 0;    // indexer key per token (one head), sparse layers only
  // 2 = BF16, 1 = FP8; fractional with scales (quant/kv_quant.h kv_bytes_per_element: FP8 with a
  // float per page-head, NVFP4 with an E4M3 per 16 elements and a float per page-head).
  double kv_dtype_bytes = 2;
  double index_dtype_bytes = 2;
};

// Bytes one token occupies across all layers (rounded up where scales make it fractional).
int64_t kv_bytes_per_token(const KvLayout& layout);
// Bytes of one page of page_size tokens (exact: page_size x the fractional bytes per token).
int64_t kv_bytes_per_page(const KvLayout& layout, int32_t page_size);

// Pages in a byte budget (CPU backend: --kv-cache-bytes or a default). Errors name the numbers:
// invalid argument when the budget does not hold a single page or page_bytes <= 0.
Result<int32_t> kv_pages_for_budget(int64_t budget_bytes, int64_t page_bytes);

// SGLang semantics: mem_fraction_static of device memory holds the static part (weights + KV
// pool); the KV pool gets what is left after the weights and a reserve for activations/graphs.
// kv_bytes = total * fraction - weight_bytes - reserve_bytes.
struct GpuKvBudget {
  int64_t device_total_bytes = 0;
  int64_t weight_bytes = 0;
  int64_t reserve_bytes = 0;
  double mem_fraction_static = 0.88;
};
Result<int32_t> kv_pages_for_mem_fraction(const GpuKvBudget& budget, int64_t page_bytes);

}  // namespace m3
