// Helpers shared by the CUDA benchmarks (cuda_decode_bench, cuda_decode_step_bench,
// cuda_prefill_bench): exit-on-error checks, the benchmark's stream, device buffers that live for
// the whole run (optionally filled with dummy data in a real format) and CUDA-event timing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/dummy/dummy_weights.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/status.h"

// A benchmark has no way to recover: any error prints where it happened and exits with 1.
#define CHECK_OK(expr)                                                                  \
  do {                                                                                  \
    ::m3::Status s_ = (expr);                                                           \
    if (!s_.is_ok()) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, s_.to_string().c_str()); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)
#define CHECK_CUDA(expr)                   \
  CHECK_OK([&]() -> ::m3::Status {         \
    M3_CUDA_RETURN_IF_ERROR(expr);         \
    return ::m3::Status::ok();             \
  }())

namespace m3::cuda_bench {

// The stream every benchmarked launch goes to (made by main).
inline cudaStream_t g_stream = nullptr;
inline CUstream_st* st() { return g_stream; }

// Seed of the next dfill (main sets the first one).
inline uint64_t g_seed = 0;

// Device buffers of `count` elements (at least one), kept until the process ends.
inline std::vector<void*> g_allocs;
template <typename T>
T* dalloc(int64_t count) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
  g_allocs.push_back(p);
  return static_cast<T*>(p);
}

// dalloc filled with dummy data of `kind` (cuda/dummy/dummy_weights.h), seeds g_seed, g_seed + 1..
template <typename T>
T* dfill(int64_t count, cuda::DummyKind kind, float scale = 1.0f) {
  T* p = dalloc<T>(count);
  const int64_t n = (kind == cuda::DummyKind::kBf16Normal || kind == cuda::DummyKind::kF32Normal)
                        ? count
                        : count * static_cast<int64_t>(sizeof(T));
  CHECK_OK(cuda::fill_dummy(p, n, kind, g_seed++, scale, st()));
  return p;
}

// Median milliseconds per call of fn(iteration) on g_stream: `warmup` untimed calls
// (iterations 0..warmup-1), then `reps` timed batches of `iters` calls (iterations 0, 1, ...).
template <typename F>
double median_ms(F&& fn, int warmup, int reps, int iters = 1) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn(i);
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
  std::vector<double> t;
  int it = 0;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(a, g_stream));
    for (int i = 0; i < iters; ++i) fn(it++);
    CHECK_CUDA(cudaEventRecord(b, g_stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / iters);
  }
  CHECK_CUDA(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// G dummy matrices [n, k] of format f back to back, in their storage layout: codes (bf16 values
// for kBf16), block scales and the NVFP4 global multipliers (nullptr where the format has none).
struct DummyMatrices {
  uint8_t* w = nullptr;
  uint8_t* scale = nullptr;
  float* global = nullptr;
};
inline DummyMatrices dummy_matrices(cuda::QuantFormat f, int64_t n, int64_t k, int64_t g) {
  using cuda::DummyKind;
  DummyMatrices m;
  const int64_t e = n * k * g;
  if (f == cuda::QuantFormat::kMxfp8) {
    m.w = dfill<uint8_t>(e, DummyKind::kE4m3Codes);
    m.scale = dfill<uint8_t>(e / 32, DummyKind::kE8m0Scales);
  } else if (f == cuda::QuantFormat::kNvfp4) {
    m.w = dfill<uint8_t>(e / 2, DummyKind::kE2m1Packed);
    m.scale = dfill<uint8_t>(e / 16, DummyKind::kE4m3Scales);
    m.global = dfill<float>(g, DummyKind::kF32Normal, 1e-3f);
  } else {
    m.w = reinterpret_cast<uint8_t*>(dfill<uint16_t>(e, DummyKind::kBf16Normal, 0.02f));
  }
  return m;
}

}  // namespace m3::cuda_bench
