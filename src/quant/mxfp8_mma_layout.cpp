#include "quant/mxfp8_mma_layout.h"

namespace m3::mxfp8_mma {

std::vector<uint8_t> pack_matrix(const uint8_t* row_major, int64_t groups, int64_t n, int64_t k,
                                 Tiling tiling) {
  std::vector<uint8_t> out(static_cast<size_t>(groups * n * k));
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* src = row_major + g * n * k;
    uint8_t* dst = out.data() + g * n * k;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) dst[offset(r, c, n, k, tiling)] = src[r * k + c];
  }
  return out;
}

}  // namespace m3::mxfp8_mma
