// Helpers for the CUDA op tests: a shared CudaBackend, upload/download with output poisoning
// (outputs are filled with NaN before an op, so an element the op failed to write is caught),
// and the worst-element report every comparison prints. u = 2^-24 is the float32 unit roundoff.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"

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
