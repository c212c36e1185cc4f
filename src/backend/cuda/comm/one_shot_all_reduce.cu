#include "backend/cuda/comm/one_shot_all_reduce.h"

#include <cuda_runtime.h>

#include <string>

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;

struct Params {
  float* buf = nullptr;
  int64_t count = 0;
  int rank = 0, ranks = 0;
  float* staging[OneShotAllReduce::kMaxRanks] = {};
  uint32_t* flags[OneShotAllReduce::kMaxRanks] = {};
  uint32_t* epoch = nullptr;
  int64_t max_elements = 0;
  unsigned long long timeout_ns = 0;
  int* timed_out = nullptr;
};

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads) one_shot_kernel(Params p) {
  const uint32_t e = *reinterpret_cast<volatile uint32_t*>(p.epoch) + 1;
  const int c = blockIdx.x, nc = gridDim.x;
  // CTA c's slice, in float4 units when the message is (count % 4 == 0, 16-byte aligned).
  const bool vec = (p.count % 4) == 0;
  const int64_t units = vec ? p.count / 4 : p.count;
  const int64_t per = (units + nc - 1) / nc;
  const int64_t lo = c * per, hi = min(units, lo + per);
  const int64_t half = (e & 1) * p.max_elements;
  float* mine = p.staging[p.rank] + half;
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    if (vec) {
      reinterpret_cast<float4*>(mine)[i] = reinterpret_cast<const float4*>(p.buf)[i];
    } else {
      mine[i] = p.buf[i];
    }
  }
  __syncthreads();
  // Tell every rank (this one too) that slice c of epoch e is staged here.
  if (threadIdx.x < p.ranks) {
    __threadfence_system();
    store_release_sys(p.flags[threadIdx.x] + p.rank * OneShotAllReduce::kMaxCtas + c, e);
  }
  // Wait for every rank's slice c.
  if (threadIdx.x < p.ranks) {
    const uint32_t* f = p.flags[p.rank] + threadIdx.x * OneShotAllReduce::kMaxCtas + c;
    const unsigned long long t0 = global_ns();
    while (static_cast<int32_t>(load_acquire_sys(f) - e) < 0) {
      if (global_ns() - t0 > p.timeout_ns) {
        *reinterpret_cast<volatile int*>(p.timed_out) = 1;
        break;
      }
    }
  }
  __syncthreads();
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    if (vec) {
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int q = 0; q < p.ranks; ++q) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(p.staging[q] + half) + i);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      reinterpret_cast<float4*>(p.buf)[i] = s;
    } else {
      float s = 0.f;
      for (int q = 0; q < p.ranks; ++q) s += __ldcg(p.staging[q] + half + i);
      p.buf[i] = s;
    }
  }
  // The last CTA to finish advances the epoch for the next launch.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.epoch + 1, 1u) == static_cast<uint32_t>(nc - 1)) {
      p.epoch[1] = 0;
      p.epoch[0] = e;
    }
  }
}

Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::ok();
  cudaGetLastError();
  return Status(StatusCode::kInternal,
                "[cuda.one_shot_all_reduce] " + what + ": " + cudaGetErrorString(e));
}

}  // namespace

Result<std::shared_ptr<OneShotAllReduce>> OneShotAllReduce::create(
    const std::vector<int>& devices, const OneShotOptions& options) {
  const int n = static_cast<int>(devices.size());
  if (n < 2 || n > kMaxRanks)
    return invalid_argument("[cuda.one_shot_all_reduce] " + std::to_string(n) +
                            " ranks: 2 to " + std::to_string(kMaxRanks));
  if (options.max_elements < 4 || options.max_elements % 4 != 0)
    return invalid_argument("[cuda.one_shot_all_reduce] max_elements " +
                            std::to_string(options.max_elements) +
                            " must be a positive multiple of 4");
  std::shared_ptr<OneShotAllReduce> g(new OneShotAllReduce());
  g->options_ = options;
  g->ranks_.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      if (devices[q] == devices[r]) continue;
      int can = 0;
      M3_RETURN_IF_ERROR(cuda_status(cudaDeviceCanAccessPeer(&can, devices[r], devices[q]),
                                     "cudaDeviceCanAccessPeer"));
      if (!can)
        return Status(StatusCode::kUnavailable,
                      "[cuda.one_shot_all_reduce] GPU " + std::to_string(devices[r]) +
                          " cannot access GPU " + std::to_string(devices[q]) + "'s memory");
    }
  }
  for (int r = 0; r < n; ++r) {
    Rank& k = g->ranks_[static_cast<size_t>(r)];
    k.device = devices[r];
    M3_RETURN_IF_ERROR(cuda_status(cudaSetDevice(k.device), "cudaSetDevice"));
    for (int q = 0; q < n; ++q) {
      if (devices[q] == k.device) continue;
      const cudaError_t pe = cudaDeviceEnablePeerAccess(devices[q], 0);
      if (pe == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        M3_RETURN_IF_ERROR(cuda_status(pe, "cudaDeviceEnablePeerAccess"));
      }
    }
    const size_t staging = static_cast<size_t>(2 * options.max_elements) * sizeof(float);
    M3_RETURN_IF_ERROR(cuda_status(cudaMalloc(&k.staging, staging), "staging buffers"));
    const size_t flag_bytes = sizeof(uint32_t) * kMaxRanks * kMaxCtas;
    M3_RETURN_IF_ERROR(cuda_status(cudaMalloc(&k.flags, flag_bytes), "flags"));
    M3_RETURN_IF_ERROR(cuda_status(cudaMemset(k.flags, 0, flag_bytes), "flags"));
    M3_RETURN_IF_ERROR(cuda_status(cudaMalloc(&k.epoch, 2 * sizeof(uint32_t)), "epoch"));
    M3_RETURN_IF_ERROR(cuda_status(cudaMemset(k.epoch, 0, 2 * sizeof(uint32_t)), "epoch"));
    M3_RETURN_IF_ERROR(cuda_status(
        cudaHostAlloc(reinterpret_cast<void**>(&k.timed_out), sizeof(int), cudaHostAllocMapped),
        "error flag"));
    *k.timed_out = 0;
  }
  for (int r = 0; r < n; ++r) {
    M3_RETURN_IF_ERROR(cuda_status(cudaSetDevice(devices[r]), "cudaSetDevice"));
    M3_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "setup"));
  }
  return g;
}

OneShotAllReduce::~OneShotAllReduce() {
  for (Rank& k : ranks_) {
    cudaSetDevice(k.device);
    cudaDeviceSynchronize();
    cudaFree(k.staging);
    cudaFree(k.flags);
    cudaFree(k.epoch);
    cudaFreeHost(k.timed_out);
  }
}

Status OneShotAllReduce::all_reduce(int rank, float* buf, int64_t count, CUstream_st* stream) {
  if (rank < 0 || rank >= ranks())
    return invalid_argument("[cuda.one_shot_all_reduce] rank " + std::to_string(rank));
  if (count < 0 || count > options_.max_elements)
    return invalid_argument("[cuda.one_shot_all_reduce] " + std::to_string(count) +
                            " elements: at most " + std::to_string(options_.max_elements));
  if (count % 4 == 0 && (reinterpret_cast<uintptr_t>(buf) & 15) != 0)
    return invalid_argument("[cuda.one_shot_all_reduce] a message of whole float4s must be "
                            "16-byte aligned");
  M3_RETURN_IF_ERROR(error(rank));
  const Rank& k = ranks_[static_cast<size_t>(rank)];
  Params p;
  p.buf = buf;
  p.count = count;
  p.rank = rank;
  p.ranks = ranks();
  for (int q = 0; q < ranks(); ++q) {
    p.staging[q] = ranks_[static_cast<size_t>(q)].staging;
    p.flags[q] = ranks_[static_cast<size_t>(q)].flags;
  }
  p.epoch = k.epoch;
  p.max_elements = options_.max_elements;
  p.timeout_ns = static_cast<unsigned long long>(options_.timeout.count()) * 1000000ull;
  p.timed_out = k.timed_out;
  // Enough CTAs that each thread moves a few float4s; every rank computes the same count.
  const int64_t units = count % 4 == 0 ? count / 4 : count;
  const int ctas = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(kMaxCtas, (units + 4 * kThreads - 1) / (4 * kThreads))));
  one_shot_kernel<<<ctas, kThreads, 0, stream>>>(p);
  return cuda_status(cudaGetLastError(), "launch");
}

Status OneShotAllReduce::error(int rank) const {
  const Rank& k = ranks_[static_cast<size_t>(rank)];
  if (*reinterpret_cast<volatile int*>(k.timed_out) == 0) return Status::ok();
  return Status(StatusCode::kUnavailable,
                "[cuda.one_shot_all_reduce] rank " + std::to_string(rank) + " of " +
                    std::to_string(ranks()) + ": another rank did not reach an all-reduce within " +
                    std::to_string(options_.timeout.count()) +
                    " ms (a rank died or stopped calling); the group is unusable");
}

}  // namespace m3::cuda
