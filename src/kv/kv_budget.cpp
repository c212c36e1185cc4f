#include "kv/kv_budget.h"

#include <cmath>
#include <limits>
#include <string>

namespace m3 {

namespace {

// Bytes per token as a double: fractional where per-page scales are spread over the page's tokens.
double token_bytes(const KvLayout& l) {
  const double kv = 2.0 * l.num_kv_heads * l.head_dim * l.kv_dtype_bytes;  // K and V
  const double ik = static_cast<double>(l.index_head_dim) * l.index_dtype_bytes;
  return l.num_dense_layers * kv + l.num_sparse_layers * (kv + ik);
}

}  // namespace

int64_t kv_bytes_per_token(const KvLayout& l) {
  return static_cast<int64_t>(std::ceil(token_bytes(l)));
}

int64_t kv_bytes_per_page(const KvLayout& layout, int32_t page_size) {
  // A page's bytes are whole (the scales are per page); rounding per token would overcount them.
  return static_cast<int64_t>(std::ceil(token_bytes(layout) * page_size));
}

Result<int32_t> kv_pages_for_budget(int64_t budget_bytes, int64_t page_bytes) {
  if (page_bytes <= 0) {
    return invalid_argument("[kv.budget] KV page size is " + std::to_string(page_bytes) +
                            " bytes; the model reports no KV layout");
  }
  const int64_t pages = budget_bytes / page_bytes;
  if (pages < 1) {
    return invalid_argument("[kv.budget] KV budget of " + std::to_string(budget_bytes) +
                            " bytes holds no page of " + std::to_string(page_bytes) + " bytes");
  }
  if (pages > std::numeric_limits<int32_t>::max()) return std::numeric_limits<int32_t>::max();
  return static_cast<int32_t>(pages);
}

Result<int32_t> kv_pages_for_mem_fraction(const GpuKvBudget& b, int64_t page_bytes) {
  if (!(b.mem_fraction_static > 0.0 && b.mem_fraction_static <= 1.0)) {
    return invalid_argument("[kv.budget] --mem-fraction-static " +
                            std::to_string(b.mem_fraction_static) + " is not in (0, 1]");
  }
  const double static_bytes = b.mem_fraction_static * static_cast<double>(b.device_total_bytes);
  const double kv_bytes = static_bytes - static_cast<double>(b.weight_bytes + b.reserve_bytes);
  if (kv_bytes < static_cast<double>(page_bytes)) {
    return invalid_argument(
        "[kv.budget] --mem-fraction-static " + std::to_string(b.mem_fraction_static) + " of " +
        std::to_string(b.device_total_bytes) + " device bytes leaves " +
        std::to_string(static_cast<int64_t>(kv_bytes)) + " bytes for the KV cache after " +
        std::to_string(b.weight_bytes) + " weight bytes and " + std::to_string(b.reserve_bytes) +
        " reserved; one page needs " + std::to_string(page_bytes) +
        ". Use more devices (--tp), raise --mem-fraction-static, or give --kv-cache-bytes");
  }
  return kv_pages_for_budget(static_cast<int64_t>(kv_bytes), page_bytes);
}

}  // namespace m3
