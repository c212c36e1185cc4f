// Per-sequence block table: page i holds token positions [i * P, (i + 1) * P) of the sequence.
// Leading pages may be shared with other sequences through the prefix index (refcount > 1); only
// the last, partially filled page is ever written.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/page_pool.h"

namespace m3 {

using BlockTable = std::vector<PageId>;

// Pages needed to hold num_tokens positions.
inline int32_t num_pages_for_tokens(int64_t num_tokens, int32_t page_size) {
  return static_cast<int32_t>((num_tokens + page_size - 1) / page_size);
}

}  // namespace m3
