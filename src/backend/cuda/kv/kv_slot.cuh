// The bf16 paged cache's slot of one token, shared by kv_write_bf16.cu and attention_inputs.cu
// (both write exactly where the other would). CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/attention/sparse_decode.h"

namespace m3::cuda {

// Slot (page · S + pos mod S) of position `pos` of row b, whose block table is
// block_tables[b · max_blocks ...]; -1 where nothing is written: pos < 0, pos / S >= max_blocks,
// or a page outside [0, num_pages) (-1 = no page).
__device__ __forceinline__ int64_t kv_cache_slot(const KvCacheView& c,
                                                 const int32_t* block_tables, int64_t max_blocks,
                                                 int64_t b, int64_t pos) {
  const int64_t blk = pos / c.page_size;
  if (pos < 0 || blk >= max_blocks) return -1;
  const int64_t page = block_tables[b * max_blocks + blk];
  if (page < 0 || page >= c.num_pages) return -1;
  return page * c.page_size + pos % c.page_size;
}

}  // namespace m3::cuda
