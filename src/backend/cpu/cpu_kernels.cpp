// Matmul kernels of the CPU backend. Generic GCC vector types (8 floats) give SIMD code without
// intrinsics; `target_clones` builds an AVX2 and a baseline copy. Both run the same IEEE float
// operations in the same order (no FMA contraction in ISO C++ mode), so they agree bitwise.
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace m3::cpu {
namespace {

typedef float v8f __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

__attribute__((always_inline)) inline v8f load_tail(const float* p, int64_t r) {  // r < 8 elements, zero-padded
  v8f v = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < r; ++i) v[i] = p[i];
  return v;
}

// Fixed pairwise lane reduction (the same everywhere).
__attribute__((always_inline)) inline float reduce8(v8f v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// One MR x NR tile: y[i][j] = Σ_k x[i][k]·w[j][k], lanes over k, tail zero-padded.
template <int MR, int NR>
__attribute__((always_inline)) inline void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
                 int64_t k, bool accumulate) {
  v8f acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k8 = k & ~int64_t{7};
  for (int64_t kk = 0; kk < k8; kk += 8) {
    v8f xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = load8(x + i * ldx + kk);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      v8f wv = load8(w + j * ldw + kk);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc[i][j] += xv[i] * wv;
    }
  }
  if (k8 < k) {
    int64_t r = k - k8;
    v8f xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = load_tail(x + i * ldx + k8, r);
    for (int j = 0; j < NR; ++j) {
      v8f wv = load_tail(w + j * ldw + k8, r);
      for (int i = 0; i < MR; ++i) acc[i][j] += xv[i] * wv;
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = reduce8(acc[i][j]);
      if (accumulate) {
        y[i * ldy + j] += s;
      } else {
        y[i * ldy + j] = s;
      }
    }
}

template <int MR>
__attribute__((always_inline)) inline void row_panel(const float* x, const float* w, float* y, int64_t mr, int64_t n, int64_t k,
                      int64_t ldy, bool acc) {
  // 4x3 tiles keep 12 accumulators in registers; single rows (decode) take 8 output columns at
  // a time so 8 independent add chains hide the add latency.
  constexpr int kNr = MR == 1 ? 8 : 3;
  int64_t j = 0;
  for (; j + kNr <= n; j += kNr) tile<MR, kNr>(x, k, w + j * k, k, y + j, ldy, k, acc);
  for (; j < n; ++j) tile<MR, 1>(x, k, w + j * k, k, y + j, ldy, k, acc);
  (void)mr;
}

}  // namespace

__attribute__((target_clones("avx2", "default"))) float dot(const float* a, const float* b,
                                                            int64_t n) {
  float y;
  tile<1, 1>(a, n, b, n, &y, 1, n, false);
  return y;
}

__attribute__((target_clones("avx2", "default"))) void gemm_nt_serial(
    const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, int64_t ldy,
    bool accumulate) {
  constexpr int kMr = 4;
  int64_t i = 0;
  for (; i + kMr <= m; i += kMr) row_panel<kMr>(x + i * k, w, y + i * ldy, kMr, n, k, ldy, accumulate);
  for (; i < m; ++i) row_panel<1>(x + i * k, w, y + i * ldy, 1, n, k, ldy, accumulate);
}

}  // namespace m3::cpu
