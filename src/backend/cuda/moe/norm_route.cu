// The batch-1 post-attention norm fused with the MoE router (moe/norm_route.h). One cluster of 8
// CTAs of 512 threads; CTA `rank` owns float4 pieces [rank · per, (rank + 1) · per) of the row
// for the norm (as the cluster norm) and router rows [rank · E/8, (rank + 1) · E/8).
//
// Phases (cluster barrier phases in brackets):
//   start   thread 0 starts the bulk copies of the CTA's router rows into shared memory; the norm
//           weight and the router bias are read (neither depends on a kernel); then the wait for
//           the kernel before (programmatic dependent launch: the copies run under its tail);
//   [1]     residual + delta, sum of squares, partials exchanged (the cluster norm's code);
//   [2]     the bf16 row: stored, and written into every CTA's shared memory; the f16 maxima;
//   [3]     each CTA's E/8 logits from its rows and the full row, stored to global and into
//           CTA 0's shared memory;
//   end     CTA 0: the top-k (one warp) and the grouping (the block), as launch_moe_route's last
//           CTA does.
#include "backend/cuda/moe/norm_route.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "backend/cuda/moe/routing_device.cuh"
#include "backend/cuda/norm/add_rms_norm_device.cuh"
#include "backend/cuda/runtime/cluster.cuh"
#include "backend/cuda/runtime/cp_async.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/mbarrier.cuh"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"

namespace m3::cuda {
namespace {

using norm::kClusterCtas;
constexpr int kThreads = 512;  // launch_moe_route's block: its per-thread chunk order
constexpr int kWarps = kThreads / 32;
constexpr int kMaxExperts = 128;              // router_topk_row<4>
constexpr int kMaxRowsPerCta = kMaxExperts / kClusterCtas;
constexpr int64_t kMaxHidden = 8192;  // the cluster norm's limit (its bits)
// Dynamic shared memory at most: the opt-in 227 KB less room for the static arrays.
constexpr size_t kSmemLimit = 226 * 1024;

// Dynamic shared memory: [E/8][hidden] bf16 router rows, the bf16 row, E bias, E logits,
// [kWarps][E/8] warp sums, top-k ids, E + 1 group offsets, 32 int2 scan sums, the mbarrier.
struct Layout {
  size_t rows, y, bias, logits, red, ids, offs, scan, bar, total;
};
__host__ __device__ inline size_t align16(size_t v) { return (v + 15) & ~size_t{15}; }
__host__ __device__ inline Layout layout(int64_t hidden, int64_t experts) {
  Layout l{};
  const size_t per = static_cast<size_t>(experts / kClusterCtas);
  l.rows = 0;
  l.y = align16(l.rows + per * hidden * 2);
  l.bias = align16(l.y + hidden * 2);
  l.logits = align16(l.bias + experts * 4);
  l.red = align16(l.logits + experts * 4);
  l.ids = align16(l.red + kWarps * per * 4);
  l.offs = align16(l.ids + routing::kMaxTopK * 4);
  l.scan = align16(l.offs + (experts + 1) * 4);
  l.bar = align16(l.scan + 32 * 8);
  l.total = l.bar + 8;
  return l;
}

__global__ void __launch_bounds__(kThreads) norm_route_kernel(NormRouteParams p) {
  pdl_launch_dependents();
  cluster_arrive_relaxed();  // phase 0: every CTA has started before anyone stores remotely
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float red[32];
  __shared__ float part_ss[kClusterCtas], part_max[kClusterCtas];
  const AddRmsNormParams& np = p.norm;
  const MoeRouteParams& rp = p.route;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t rank = cluster_ctarank();
  const int64_t hidden = np.hidden, experts = rp.num_experts;
  const int per_cta = static_cast<int>(experts / kClusterCtas);
  const Layout L = layout(hidden, experts);
  const uint16_t* w_s = reinterpret_cast<const uint16_t*>(smem + L.rows);
  uint16_t* y_s = reinterpret_cast<uint16_t*>(smem + L.y);
  float* bias_s = reinterpret_cast<float*>(smem + L.bias);
  float* logit_s = reinterpret_cast<float*>(smem + L.logits);
  float* red_s = reinterpret_cast<float*>(smem + L.red);  // [kWarps][per_cta]
  int32_t* ids_s = reinterpret_cast<int32_t*>(smem + L.ids);
  int32_t* offs_s = reinterpret_cast<int32_t*>(smem + L.offs);
  int2* scan_s = reinterpret_cast<int2*>(smem + L.scan);
  const uint32_t bar = smem_u32(smem + L.bar);

  // ---- Start: this CTA's router rows (contiguous in global memory) by bulk copies, counted on
  // one mbarrier; they depend on no kernel.
  const uint32_t row_bytes = static_cast<uint32_t>(hidden * 2);
  if (tid == 0) {
    mbar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    mbar_expect_tx(bar, row_bytes * per_cta);
    const uint64_t pol = l2_evict_first();
    for (int j = 0; j < per_cta; ++j)
      bulk_copy(smem_u32(smem + L.rows + size_t{row_bytes} * j),
                rp.w + (int64_t{rank} * per_cta + j) * hidden, row_bytes, bar, pol);
  }
  if (rp.bias != nullptr)
    for (int64_t e = tid; e < experts; e += kThreads) bias_s[e] = rp.bias[e];
  // The cluster norm's piece of this thread (add_rms_norm.cu, add_rms_norm_cluster_kernel).
  const int64_t nv = hidden / 4, per = nv / kClusterCtas;
  const int64_t i = int64_t{rank} * per + tid;
  const bool mine = tid < per;
  float4* r = reinterpret_cast<float4*>(np.residual);
  const float4* d = reinterpret_cast<const float4*>(np.delta);  // row 0
  const bool has_delta = d != nullptr || np.delta_partial != nullptr || np.moe_contrib != nullptr;
  const uint2 wv = mine ? reinterpret_cast<const uint2*>(np.weight)[i] : make_uint2(0, 0);
  pdl_wait();

  // ---- [1] residual + delta and the sum of squares.
  float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (mine) x = norm::row_piece(np, r, d, has_delta, 0, i, nv);
  if (mine && has_delta) r[i] = x;
  float ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, x.w * x.w)));
  ss = block_sum(ss, red);  // the extra warps add exact zeros: the cluster kernel's bits
  cluster_wait();           // phase 0
  if (tid < kClusterCtas) st_shared_cluster(&part_ss[rank], tid, ss);
  cluster_arrive_release();
  cluster_wait();  // phase 1
  float total = 0.0f;
#pragma unroll
  for (int c = 0; c < kClusterCtas; ++c) total += part_ss[c];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(hidden) + np.eps);

  // ---- [2] the bf16 row, to global and into every CTA's copy; the f16 maxima.
  uint2 ob = make_uint2(0, 0);
  float m = 0.0f;
  if (mine) {
    ob = norm::norm_piece(x, inv, wv);
    reinterpret_cast<uint2*>(np.out)[i] = ob;
    m = norm::abs_max_bf16x4(ob, m);
#pragma unroll
    for (int c = 0; c < kClusterCtas; ++c) st_shared_cluster_u2(y_s + 4 * i, c, ob);
  }
  const bool f16 = np.out_f16 != nullptr;
  if (f16) {
    m = block_max(m, red);
    if (tid < kClusterCtas) st_shared_cluster(&part_max[rank], tid, m);
  }
  cluster_arrive_release();
  cluster_wait();  // phase 2: the whole row and every maximum are here
  if (f16) {
#pragma unroll
    for (int c = 0; c < kClusterCtas; ++c) m = fmaxf(m, part_max[c]);
    const int sh = f16_row_shift(m);
    if (rank == 0 && tid == 0) np.out_inv_scale[0] = ldexpf(1.0f, -sh);
    if (mine) reinterpret_cast<uint2*>(np.out_f16)[i] = norm::f16_piece(ob, ldexpf(1.0f, sh));
  }

  // ---- [3] this CTA's logits: launch_moe_route's order (thread tid sums the chunks tid,
  // tid + 512, ... of K; warp butterfly; warp sums in warp order).
  mbar_wait(bar, 0);
  float acc[kMaxRowsPerCta];
#pragma unroll
  for (int j = 0; j < kMaxRowsPerCta; ++j) acc[j] = 0.0f;
  const int64_t nch = hidden / 8;
  for (int64_t c = tid; c < nch; c += kThreads) {
    const uint4 xv = *reinterpret_cast<const uint4*>(y_s + c * 8);
#pragma unroll
    for (int j = 0; j < kMaxRowsPerCta; ++j) {
      if (j < per_cta) {
        float wf[8];
        routing::unpack8(*reinterpret_cast<const uint4*>(w_s + j * hidden + c * 8), wf);
        acc[j] = routing::dot8(acc[j], xv, wf);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxRowsPerCta; ++j) {
    if (j < per_cta) {
      const float v = warp_sum(acc[j]);
      if (lane == 0) red_s[warp * per_cta + j] = v;
    }
  }
  __syncthreads();
  if (tid < per_cta) {
    float s = red_s[tid];
    for (int w = 1; w < kWarps; ++w) s += red_s[w * per_cta + tid];
    const int64_t e = int64_t{rank} * per_cta + tid;
    rp.logits[e] = s;
    st_shared_cluster(&logit_s[e], 0, s);
  }
  cluster_arrive_release();
  cluster_wait();  // phase 3: CTA 0 holds every logit; nobody touches another CTA's memory after
  if (rank != 0) return;

  // ---- End (CTA 0): top-k and grouping, launch_moe_route's last-CTA code.
  if (warp == 0)
    routing::router_topk_row<4>([logit_s](int e) { return logit_s[e]; },
                                rp.bias != nullptr ? bias_s : nullptr, experts, rp.top_k,
                                rp.scaling, rp.topk_ids, rp.topk_w, ids_s);
  __syncthreads();
  routing::group_by_expert_block(ids_s, rp.top_k, experts, offs_s, scan_s, rp.group_offsets,
                                 rp.sorted_rows, rp.active_groups);
}

}  // namespace

std::string norm_route_problem(const NormRouteParams& p) {
  const AddRmsNormParams& n = p.norm;
  const MoeRouteParams& r = p.route;
  if (n.t != 1 || r.rows != 1) return "runs one token (norm.t and route.rows must be 1)";
  if (n.hidden <= 0 || n.hidden % 32 != 0 || n.hidden > kMaxHidden)
    return "hidden " + std::to_string(n.hidden) + " must be a positive multiple of 32, at most " +
           std::to_string(kMaxHidden);
  if (r.hidden != n.hidden || r.x != n.out || r.ldx != n.hidden)
    return "the router must read the norm's output row (x == out, ldx == hidden == norm hidden)";
  if (r.num_experts <= 0 || r.num_experts % kClusterCtas != 0 || r.num_experts > kMaxExperts)
    return "num_experts " + std::to_string(r.num_experts) + " must be a multiple of 8, at most 128";
  if (r.top_k < 1 || r.top_k > routing::kMaxTopK || r.top_k > r.num_experts)
    return "top_k " + std::to_string(r.top_k) + " outside [1, min(16, num_experts)]";
  if (layout(n.hidden, r.num_experts).total > kSmemLimit)
    return "E/8 router rows of " + std::to_string(n.hidden) + " bf16 do not fit in shared memory";
  if (n.residual == nullptr || n.weight == nullptr || n.out == nullptr || r.w == nullptr ||
      r.logits == nullptr || r.topk_ids == nullptr || r.topk_w == nullptr ||
      r.group_offsets == nullptr || r.sorted_rows == nullptr || r.active_groups == nullptr)
    return "null input or output pointer";
  if ((n.out_f16 == nullptr) != (n.out_inv_scale == nullptr))
    return "out_f16 and out_inv_scale go together";
  const int sources = (n.delta != nullptr) + (n.delta_partial != nullptr) + (n.moe_contrib != nullptr);
  if (sources > 1) return "at most one of delta, delta_partial, moe_contrib";
  if (n.delta_partial != nullptr && n.delta_slices < 1) return "delta_partial needs delta_slices >= 1";
  if (n.moe_contrib != nullptr && (n.moe_weights == nullptr || n.moe_top_k < 1))
    return "moe_contrib needs moe_weights and moe_top_k >= 1";
  if (reinterpret_cast<uintptr_t>(r.w) % 16 != 0 || reinterpret_cast<uintptr_t>(n.out) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(n.residual) % 16 != 0)
    return "router weights, residual and out must be 16-byte aligned";
  return "";
}

Status launch_norm_route(const NormRouteParams& p, CUstream_st* stream) {
  const std::string why = norm_route_problem(p);
  if (!why.empty()) return invalid_argument("[cuda.norm_route] " + why);
  static std::once_flag once;
  static cudaError_t attr_err = cudaSuccess;
  std::call_once(once, [] {
    attr_err = cudaFuncSetAttribute(norm_route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kSmemLimit));
    if (attr_err != cudaSuccess) (void)cudaGetLastError();  // not left for the next launch check
  });
  M3_CUDA_RETURN_IF_ERROR(attr_err);
  M3_CUDA_RETURN_IF_ERROR(launch_cluster_kernel(
      p.norm.pdl, norm_route_kernel, dim3(kClusterCtas), dim3(kThreads),
      layout(p.norm.hidden, p.route.num_experts).total, kClusterCtas, stream, p));
  return Status::ok();
}

}  // namespace m3::cuda
