// Helpers for the CUDA op tests: a shared CudaBackend, upload/download with output poisoning
// (outputs are filled with NaN before an op, so an element the op failed to write is caught),
// and the worst-element report every comparison prints. u = 2^-24 is the float32 unit roundoff.
// The tests live in namespace m3::cuda_test (inside an anonymous namespace), so they use these
// helpers unqualified.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"

struct CUstream_st;

namespace m3::cuda_test {

constexpr double kU = 1.0 / (1 << 24);

inline double gamma(double n) { return n * kU / (1.0 - n * kU); }

inline CudaBackend* gpu() {
  static std::unique_ptr<CudaBackend> be = [] {
    auto r = CudaBackend::create(0);
    if (!r.is_ok()) {
      std::fprintf(stderr, "no usable GPU: %s\n", r.status().to_string().c_str());
      std::exit(2);
    }
    return std::move(r).value();
  }();
  return be.get();
}

inline CpuBackend* cpu() {
  static CpuBackend be(0);
  return &be;
}

inline std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Rounds *f to bf16 in place (each value becomes exactly its bf16 value); returns the bits.
inline std::vector<uint16_t> to_bf16(std::vector<float>* f) {
  std::vector<uint16_t> b(f->size());
  for (size_t i = 0; i < f->size(); ++i) {
    b[i] = f32_to_bf16((*f)[i]);
    (*f)[i] = bf16_to_f32(b[i]);
  }
  return b;
}

// Random normal values rounded to bf16: the float copy (exactly the bf16 value) and the bits.
inline void bf16_randn(int64_t n, uint32_t seed, float scale, std::vector<float>* f,
                       std::vector<uint16_t>* b) {
  *f = randn(n, seed, scale);
  *b = to_bf16(f);
}

inline std::vector<float> abs_of(std::vector<float> v) {
  for (float& x : v) x = std::abs(x);
  return v;
}

// The shared backend's stream, as the kernel launchers take it.
inline CUstream_st* stream() {
  return static_cast<CUstream_st*>(gpu()->stream());
}

// The cache rows ((page · S + j % S) · Hkv + g) of KV head g for the positions j <= pos of the
// given blocks of one sequence (`table`: its block -> page table, pages of S positions).
inline std::vector<int64_t> kv_rows(const std::set<int64_t>& blocks, int64_t pos,
                                    const int32_t* table, int64_t S, int64_t Hkv, int64_t g) {
  std::vector<int64_t> rows;
  for (int64_t blk : blocks)
    for (int64_t j = blk * S; j <= std::min<int64_t>(pos, (blk + 1) * S - 1); ++j)
      rows.push_back((table[blk] * S + j % S) * Hkv + g);
  return rows;
}

// Double-precision attention of one query q[D] over the keys / values at `rows` of k and v
// (rows of D floats), scores scaled by `scale`: per output dimension the exact o, Σp|v| and
// Σp|v - o|, and delta = max over keys of gamma_{D+2}·Σ|q||k|·scale + u·|score| (the float32
// score error), for the bounds of the attention tests.
struct AttentionRef {
  std::vector<double> o, pv, dev;
  double delta = 0;
  size_t keys = 0;
};
inline AttentionRef attention_ref(const float* q, const std::vector<int64_t>& rows, const float* k,
                                  const float* v, int64_t D, double scale) {
  std::vector<double> sc, mg;
  std::vector<const float*> vr;
  for (int64_t row : rows) {
    double s = 0, a = 0;
    for (int64_t i = 0; i < D; ++i) {
      s += double(q[i]) * k[row * D + i];
      a += std::abs(double(q[i]) * k[row * D + i]);
    }
    sc.push_back(s * scale);
    mg.push_back(a * scale);
    vr.push_back(v + row * D);
  }
  AttentionRef r;
  r.keys = sc.size();
  const double mx = *std::max_element(sc.begin(), sc.end());
  double sum = 0;
  for (size_t j = 0; j < sc.size(); ++j) {
    sum += std::exp(sc[j] - mx);
    r.delta = std::max(r.delta, gamma(D + 2) * mg[j] + kU * std::abs(sc[j]));
  }
  r.o.resize(D), r.pv.resize(D), r.dev.resize(D);
  for (int64_t i = 0; i < D; ++i) {
    double o = 0, pv = 0, dev = 0;
    for (size_t j = 0; j < sc.size(); ++j) o += std::exp(sc[j] - mx) / sum * vr[j][i];
    for (size_t j = 0; j < sc.size(); ++j) {
      const double pj = std::exp(sc[j] - mx) / sum;
      pv += pj * std::abs(vr[j][i]);
      dev += pj * std::abs(vr[j][i] - o);
    }
    r.o[i] = o, r.pv[i] = pv, r.dev[i] = dev;
  }
  return r;
}

// A device copy of a host vector (owned by the test).
template <typename T>
struct Dev {
  DeviceBuffer<T> buf;
  explicit Dev(const std::vector<T>& h) : buf(gpu(), static_cast<int64_t>(h.size())) {
    gpu()->copy_to_device(buf.data(), h.data(), static_cast<int64_t>(h.size() * sizeof(T)));
  }
  // An output of n elements poisoned with all-ones bytes (NaN for floats, -1 for ints).
  static Dev poisoned(int64_t n) {
    Dev d(std::vector<T>(static_cast<size_t>(n)));
    gpu()->synchronize();
    // cudaMemset is not reachable from here without CUDA headers: copy a poison vector.
    std::vector<unsigned char> ff(static_cast<size_t>(n) * sizeof(T), 0xFF);
    gpu()->copy_to_device(d.buf.data(), ff.data(), static_cast<int64_t>(ff.size()));
    return d;
  }
  T* ptr() { return buf.data(); }
  std::vector<T> host() {
    std::vector<T> h(static_cast<size_t>(buf.size()));
    gpu()->copy_to_host(h.data(), buf.data(), static_cast<int64_t>(h.size() * sizeof(T)));
    return h;
  }
};

// |got - want| <= bound per element; reports the worst ratio with its index, always printed.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(bound.size(), want.size()) << what;
  double worst = 0.0, worst_err = 0.0;
  size_t wi = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": element " << i << " not written (NaN)";
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double r = err / bound[i];
    if (r > worst) worst = r, wi = i, worst_err = err;
  }
  std::printf("[ %-40s ] n=%zu worst |gpu-cpu|/bound = %.3g at %zu (err %.3g, bound %.3g)\n",
              what.c_str(), got.size(), worst, wi, worst_err, got.empty() ? 0.0 : bound[wi]);
  EXPECT_LE(worst, 1.0) << what << ": element " << wi << " gpu " << got[wi] << " cpu " << want[wi]
                        << " bound " << bound[wi];
}

}  // namespace m3::cuda_test
