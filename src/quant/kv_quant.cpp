#include "quant/kv_quant.h"

namespace m3 {

const char* kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kFloat32: return "float32";
    case KvCacheDtype::kBF16: return "bf16";
    case KvCacheDtype::kFp8E4M3: return "fp8_e4m3";
    case KvCacheDtype::kFp4E2M1: return "fp4_e2m1";
  }
  return "?";
}

Result<KvCacheDtype> parse_kv_cache_dtype(std::string_view s) {
  for (KvCacheDtype d : {KvCacheDtype::kFloat32, KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3,
                         KvCacheDtype::kFp4E2M1}) {
    if (s == kv_cache_dtype_name(d)) return d;
  }
  return invalid_argument("KV cache dtype '" + std::string(s) +
                          "' is not one of float32, bf16, fp8_e4m3, fp4_e2m1");
}

double kv_bytes_per_element(KvCacheDtype d, int64_t page_size, int64_t dim) {
  double bytes = static_cast<double>(kv_row_code_bytes(d, dim) + kv_row_block_scale_bytes(d, dim)) /
                 static_cast<double>(dim);
  if (kv_has_page_scale(d)) bytes += 4.0 / static_cast<double>(page_size * dim);
  return bytes;
}

}  // namespace m3
