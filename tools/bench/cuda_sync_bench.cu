// What a dependency between two steps of a decode layer costs on the GPU, inside a CUDA graph:
// a kernel boundary (plain launch, or programmatic dependent launch) against a grid-wide barrier
// inside one persistent kernel, and a dependent L2 round trip. The decode step at batch 1 is a
// chain of ~11 small kernels per layer (docs/design/decode-kernels.md); this says how much of each
// link a persistent kernel per attention block could save.
//
// Each "step" does the same small work on every CTA (one 16-byte load of what the previous step
// wrote, one store), so the time is the dependency's, not the work's. Grid: 2 CTAs of 256
// threads per SM (all resident, as a cooperative launch requires).
//
// Usage: cuda_sync_bench   (prints one row per mechanism: us per dependency, from the slope
//                           between 1 and 17 steps)
#include <cuda_runtime.h>

#include <cooperative_groups.h>

#include <cstdio>
#include <cstdlib>

#include "backend/cuda/runtime/pdl.cuh"

namespace {

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));   \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int kThreads = 256;

// One step: every thread reads its element of `in` (written by the previous step) and writes
// in + 1 to `out`.
__device__ __forceinline__ void step(const float4* in, float4* out) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  float4 v = __ldcg(in + i);
  v.x += 1.0f;
  __stcg(out + i, v);
}

__global__ void __launch_bounds__(kThreads) step_kernel(const float4* in, float4* out, bool pdl) {
  if (pdl) {
    m3::cuda::pdl_launch_dependents();
    m3::cuda::pdl_wait();
  }
  step(in, out);
}

// `steps` steps in one cooperative launch, a grid barrier between them.
__global__ void __launch_bounds__(kThreads) persistent_kernel(float4* a, float4* b, int steps) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  for (int s = 0; s < steps; ++s) {
    step(s % 2 ? b : a, s % 2 ? a : b);
    grid.sync();
  }
}

// One thread follows `hops` pointers through L2 (each address is the value just loaded).
__global__ void chase_kernel(const int* next, int hops, int* sink) {
  int i = 0;
  for (int h = 0; h < hops; ++h) i = __ldcg(next + i);
  *sink = i;
}

// Mean time over 200 launches (after 20 warm-ups) of a graph built by `capture`.
template <typename F>
double graph_us(cudaStream_t s, F capture) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  capture();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(ge, s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  constexpr int kReps = 200;
  for (int i = 0; i < kReps; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return 1e3 * ms / kReps;
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int ctas = 2 * sms;
  const size_t n = static_cast<size_t>(ctas) * kThreads;
  float4 *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, n * sizeof(float4)));
  CK(cudaMalloc(&b, n * sizeof(float4)));
  CK(cudaMemset(a, 0, n * sizeof(float4)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("device: %d SMs; grid %d CTAs x %d threads; CUDA graph, mean of 200 replays\n", sms,
              ctas, kThreads);

  auto kernels = [&](int steps, bool pdl) {
    return graph_us(s, [&] {
      for (int i = 0; i < steps; ++i)
        CK(m3::cuda::launch_kernel(pdl, step_kernel, dim3(ctas), dim3(kThreads), 0, s,
                                   i % 2 ? b : a, i % 2 ? a : b, pdl));
    });
  };
  auto persistent = [&](int steps) {
    return graph_us(s, [&] {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(ctas);
      cfg.blockDim = dim3(kThreads);
      cfg.stream = s;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, persistent_kernel, a, b, steps));
    });
  };
  constexpr int kLo = 1, kHi = 17;
  const double k1 = kernels(kLo, false), k17 = kernels(kHi, false);
  const double p1 = kernels(kLo, true), p17 = kernels(kHi, true);
  const double g1 = persistent(kLo), g17 = persistent(kHi);
  std::printf("%-44s %8.2f us per dependency (1 step %.2f us, 17 steps %.2f us)\n",
              "kernel boundary, plain launches", (k17 - k1) / (kHi - kLo), k1, k17);
  std::printf("%-44s %8.2f us per dependency (1 step %.2f us, 17 steps %.2f us)\n",
              "kernel boundary, programmatic dependent", (p17 - p1) / (kHi - kLo), p1, p17);
  std::printf("%-44s %8.2f us per dependency (1 step %.2f us, 17 steps %.2f us)\n",
              "grid barrier in one cooperative kernel", (g17 - g1) / (kHi - kLo), g1, g17);

  // L2 round trip: a pointer chase over a 1 MB ring (L2-resident after the first pass).
  constexpr int kRing = 1 << 18;
  int* next = nullptr;
  int* sink = nullptr;
  CK(cudaMalloc(&next, kRing * sizeof(int)));
  CK(cudaMalloc(&sink, sizeof(int)));
  {
    int* h = static_cast<int*>(std::malloc(kRing * sizeof(int)));
    for (int i = 0; i < kRing; ++i) h[i] = (i + 4099 * 32) % kRing;  // 16 KB strides
    CK(cudaMemcpy(next, h, kRing * sizeof(int), cudaMemcpyHostToDevice));
    std::free(h);
  }
  const double c1 = graph_us(s, [&] { chase_kernel<<<1, 1, 0, s>>>(next, 16, sink); });
  const double c2 = graph_us(s, [&] { chase_kernel<<<1, 1, 0, s>>>(next, 1040, sink); });
  std::printf("%-44s %8.3f us per hop\n", "dependent L2 load (pointer chase)", (c2 - c1) / 1024);
  CK(cudaGetLastError());
  return 0;
}
