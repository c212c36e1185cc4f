#include "backend/cuda/comm/one_shot_all_reduce.h"

#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/norm/add_rms_norm_device.cuh"
#include "backend/cuda/runtime/reduce.cuh"

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

// Tells every rank (this one too) that slice c of epoch e is staged here, then waits until every
// rank's slice c is (or the timeout passes: the group is then marked failed). Called by all the
// CTA's threads after its staging writes and a __syncthreads.
__device__ __forceinline__ void signal_and_wait(const Params& p, int c, uint32_t e) {
  if (threadIdx.x < p.ranks) {
    __threadfence_system();
    store_release_sys(p.flags[threadIdx.x] + p.rank * OneShotAllReduce::kMaxCtas + c, e);
  }
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
}

// The ranks' float4 at `at` of the staged halves, summed in rank order from 0.
__device__ __forceinline__ float4 sum_ranks(const Params& p, int64_t half, int64_t at) {
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int q = 0; q < p.ranks; ++q) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(p.staging[q] + half) + at);
    s.x += v.x;
    s.y += v.y;
    s.z += v.z;
    s.w += v.w;
  }
  return s;
}

// The last CTA to finish advances the epoch for the next launch.
__device__ __forceinline__ void advance_epoch(const Params& p, int nc, uint32_t e) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.epoch + 1, 1u) == static_cast<uint32_t>(nc - 1)) {
      p.epoch[1] = 0;
      p.epoch[0] = e;
    }
  }
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
  signal_and_wait(p, c, e);
  __syncthreads();
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    if (vec) {
      reinterpret_cast<float4*>(p.buf)[i] = sum_ranks(p, half, i);
    } else {
      float s = 0.f;
      for (int q = 0; q < p.ranks; ++q) s += __ldcg(p.staging[q] + half + i);
      p.buf[i] = s;
    }
  }
  advance_epoch(p, nc, e);
}

// all_reduce_add_rms_norm: the signalling of one_shot_kernel, by whole rows, then the norm of
// add_rms_norm_kernel (norm/add_rms_norm.cu) on the summed rows: the same threads (1024), the same
// float4 pieces per thread and the same reductions, so the bits are its.
constexpr int kNormThreads = 1024;
constexpr int kNormVecPerThread = 2;  // hidden <= 1024 · 2 · 4 = 8192

__global__ void __launch_bounds__(kNormThreads)
    one_shot_add_rms_norm_kernel(Params p, const float* delta, AddRmsNormParams n) {
  __shared__ float red[32];
  const uint32_t e = *reinterpret_cast<volatile uint32_t*>(p.epoch) + 1;
  const int c = blockIdx.x, nc = gridDim.x;
  const int64_t nv = n.hidden / 4;
  const int64_t half = (e & 1) * p.max_elements;
  float4* mine = reinterpret_cast<float4*>(p.staging[p.rank] + half);
  const float4* d = reinterpret_cast<const float4*>(delta);
  for (int64_t t = c; t < n.t; t += nc)
    for (int64_t i = threadIdx.x; i < nv; i += kNormThreads) mine[t * nv + i] = d[t * nv + i];
  __syncthreads();
  signal_and_wait(p, c, e);
  __syncthreads();
  const uint2* w = reinterpret_cast<const uint2*>(n.weight);
  for (int64_t t = c; t < n.t; t += nc) {
    float4* r = reinterpret_cast<float4*>(n.residual + t * n.hidden);
    float4 v[kNormVecPerThread];
    uint2 wv[kNormVecPerThread];
#pragma unroll
    for (int j = 0; j < kNormVecPerThread; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kNormThreads;
      if (i >= nv) continue;
      wv[j] = w[i];
      // The ranks' partials in rank order from 0 (one_shot_kernel's sum), then residual + sum
      // (add_rms_norm's row_piece).
      const float4 sum = sum_ranks(p, half, t * nv + i);
      const float4 x = r[i];
      v[j] = make_float4(x.x + sum.x, x.y + sum.y, x.z + sum.z, x.w + sum.w);
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormVecPerThread; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kNormThreads;
      if (i < nv) {
        const float4 x = v[j];
        r[i] = x;
        ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
      }
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(n.hidden) + n.eps);
    uint2* o = reinterpret_cast<uint2*>(n.out + t * n.hidden);
    uint2 ob[kNormVecPerThread];
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormVecPerThread; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kNormThreads;
      if (i < nv) {
        ob[j] = norm::norm_piece(v[j], inv, wv[j]);
        o[i] = ob[j];
        m = norm::abs_max_bf16x4(ob[j], m);
      }
    }
    if (n.out_f16 == nullptr) continue;
    m = block_max(m, red);
    const int sh = f16_row_shift(m);
    const float sc = ldexpf(1.0f, sh);
    if (threadIdx.x == 0) n.out_inv_scale[t] = ldexpf(1.0f, -sh);
    uint2* of = reinterpret_cast<uint2*>(n.out_f16 + t * n.hidden);
#pragma unroll
    for (int j = 0; j < kNormVecPerThread; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kNormThreads;
      if (i < nv) of[i] = norm::f16_piece(ob[j], sc);
    }
  }
  advance_epoch(p, nc, e);
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

Status OneShotAllReduce::all_reduce_add_rms_norm(int rank, const float* delta,
                                                 const AddRmsNormParams& norm,
                                                 CUstream_st* stream) {
  const auto bad = [](const std::string& why) {
    return invalid_argument("[cuda.one_shot_all_reduce] add_rms_norm: " + why);
  };
  if (rank < 0 || rank >= ranks()) return bad("rank " + std::to_string(rank));
  if (norm.t < 0 || norm.hidden <= 0 || norm.hidden % 4 != 0 ||
      norm.hidden > int64_t{kNormThreads} * kNormVecPerThread * 4)
    return bad("hidden " + std::to_string(norm.hidden) +
               " must be a positive multiple of 4, at most 8192");
  if (norm.t * norm.hidden > options_.max_elements)
    return bad(std::to_string(norm.t * norm.hidden) + " elements: at most " +
               std::to_string(options_.max_elements));
  if (norm.delta != nullptr || norm.delta_partial != nullptr || norm.moe_contrib != nullptr)
    return bad("the delta is the all-reduced message; no other delta source");
  if (delta == nullptr || norm.residual == nullptr || norm.weight == nullptr || norm.out == nullptr)
    return bad("null delta, residual, weight or output");
  if ((norm.out_f16 == nullptr) != (norm.out_inv_scale == nullptr))
    return bad("out_f16 and out_inv_scale go together");
  for (const void* ptr : {static_cast<const void*>(delta), static_cast<const void*>(norm.residual),
                          static_cast<const void*>(norm.weight), static_cast<const void*>(norm.out)})
    if ((reinterpret_cast<uintptr_t>(ptr) & 7) != 0 ||
        ((ptr == delta || ptr == norm.residual) && (reinterpret_cast<uintptr_t>(ptr) & 15) != 0))
      return bad("delta and residual must be 16-byte aligned, weight and out 8-byte aligned");
  if (norm.t == 0) return Status::ok();
  M3_RETURN_IF_ERROR(error(rank));
  const Rank& k = ranks_[static_cast<size_t>(rank)];
  Params p;
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
  // Every rank computes the same CTA count from the same rows.
  const int ctas = static_cast<int>(std::min<int64_t>(kMaxCtas, norm.t));
  one_shot_add_rms_norm_kernel<<<ctas, kNormThreads, 0, stream>>>(p, delta, norm);
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
