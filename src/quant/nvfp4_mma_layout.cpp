#include "quant/nvfp4_mma_layout.h"

#include <cstdlib>

namespace m3::nvfp4_mma {
namespace {

constexpr int kTBits[8] = {9, 10, 11, 15, 25, 26, 27, 31};

// y = F(x): bit 8f + q of y is bit kTBits[q] of fragment f of x.
uint32_t forward(uint32_t x) {
  uint32_t y = 0;
  for (int f = 0; f < 4; ++f) {
    const uint32_t fr = fragment(x, f);
    for (int q = 0; q < 8; ++q) y |= ((fr >> kTBits[q]) & 1u) << (8 * f + q);
  }
  return y;
}

// The inverse of F by Gauss-Jordan elimination over GF(2) on the augmented rows [F | I]: row e
// starts as (F(e_e), e_e); reduced to (e_b, x_b) it gives the inverse column b = x_b.
PackTable make_table() {
  uint32_t lhs[32], rhs[32];
  for (int e = 0; e < 32; ++e) lhs[e] = forward(1u << e), rhs[e] = 1u << e;
  for (int b = 0; b < 32; ++b) {
    int piv = -1;
    for (int r = b; r < 32 && piv < 0; ++r)
      if (lhs[r] >> b & 1u) piv = r;
    if (piv < 0) std::abort();  // F is invertible by construction (tests/quant checks)
    std::swap(lhs[b], lhs[piv]);
    std::swap(rhs[b], rhs[piv]);
    for (int r = 0; r < 32; ++r)
      if (r != b && (lhs[r] >> b & 1u)) lhs[r] ^= lhs[b], rhs[r] ^= rhs[b];
  }
  PackTable t{};
  for (int b = 0; b < 32; ++b) t[static_cast<size_t>(b)] = rhs[b];
  return t;
}

}  // namespace

const PackTable& pack_table() {
  static const PackTable table = make_table();
  return table;
}

std::vector<uint8_t> pack_matrix(const uint8_t* row_major, int64_t groups, int64_t n, int64_t k,
                                 Tiling tiling) {
  const int64_t bytes = n * k / 2, tiles = n / 16, chunks = k / kChunkK;
  std::vector<uint8_t> out(static_cast<size_t>(groups * bytes));
  const uint32_t* table = pack_table().data();
  for (int64_t gi = 0; gi < groups; ++gi) {
    const uint8_t* src = row_major + gi * bytes;
    uint8_t* dst = out.data() + gi * bytes;
    for (int64_t tau = 0; tau < tiles; ++tau)
      for (int64_t c = 0; c < chunks; ++c)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < 8; ++i) {
            const int g = lane >> 2, t = lane & 3;
            uint8_t nib[2][4];
            for (int h = 0; h < 2; ++h) {
              const int64_t row = tile_row(tau, g + 8 * h, n, tiling);
              for (int j = 0; j < 4; ++j) {
                const int64_t col = c * kChunkK + 32 * t + 4 * i + j;
                const uint8_t byte = src[row * (k / 2) + col / 2];
                nib[h][j] = col % 2 ? byte >> 4 : byte & 15;
              }
            }
            const uint32_t x = pack_word(table, nib);
            uint8_t* p = dst + word_offset(tau, c, lane, i, k);
            p[0] = uint8_t(x), p[1] = uint8_t(x >> 8), p[2] = uint8_t(x >> 16), p[3] = uint8_t(x >> 24);
          }
  }
  return out;
}

}  // namespace m3::nvfp4_mma
