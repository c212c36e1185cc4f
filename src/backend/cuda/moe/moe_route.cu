// Fused MoE router (moe_route.h): router GEMV, sigmoid top-k and token-to-expert grouping in one
// launch. Phase 1 (every CTA): whole-K dot products of one weight row (bf16 or float32) with a
// block of rows.
// Phase 2 (the last CTA to finish phase 1, found with a fence + atomic counter): top-k of every
// row, then (unless topk_only) the grouping, with the same device code as launch_router_topk and
// launch_group_by_expert (moe/routing_device.cuh).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/cuda/moe/moe_route.h"
#include "backend/cuda/moe/routing_device.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"

namespace m3::cuda {
namespace {

constexpr int kThreads = routing::kDotLanes;  // one summation lane per thread (moe_route.h)
constexpr int kWarps = kThreads / 32;
static_assert(kWarps == routing::kDotGroups);
constexpr int64_t kMaxRows = 256;
constexpr int kRowBlock = 32;  // rows per CTA (grid.y = ceil(rows / 32))
constexpr int kRowTile = 4;    // rows per pass over K (accumulators per thread)

__device__ __forceinline__ uint4 ld16(const uint16_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
using routing::dot8;
using routing::load_w_chunk;
using routing::unpack_w;
using routing::WeightChunk;

// Grid (E, ceil(rows / kRowBlock)), kThreads threads; W: the weight's element type (uint16_t:
// bf16, float). Summation order of logit (r, e): thread t owns the 8-element chunks t,
// t + kThreads, t + 2·kThreads, ... of K and sums them in that order (8 fmas per chunk), then a
// warp butterfly, then the kWarps warp sums in warp order. It depends on `hidden` only.
template <int kPer, typename W>
__global__ void __launch_bounds__(kThreads) moe_route_kernel(MoeRouteParams p, const W* w) {
  __shared__ float red[2][kWarps][kRowTile];
  __shared__ int32_t s_ids[kMaxRows * routing::kMaxTopK];
  __shared__ int32_t s_offs[routing::kMaxExperts + 1];
  __shared__ int2 s_warp_sums[32];
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t e = blockIdx.x;
  const int64_t r0 = int64_t{blockIdx.y} * kRowBlock;
  const int64_t r1 = r0 + kRowBlock < p.rows ? r0 + kRowBlock : p.rows;
  const int64_t nch = p.hidden / 8;
  const W* wrow = w + e * p.hidden;
  // The weight row depends on no kernel: into L2 before the wait for the previous one (which
  // writes x; a no-op without the programmatic launch attribute).
  for (int64_t c = tid; c < nch; c += kThreads)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow + c * 8));
  pdl_wait();

  // ---- Phase 1: logits[r0..r1), e. Weight chunks come through L1 (ld.global.nc): the first row
  // tile reads them from memory, later tiles of the block hit L1 / L2.
  int buf = 0;
  for (int64_t rt = r0; rt < r1; rt += kRowTile, buf ^= 1) {
    const int nr = static_cast<int>(r1 - rt < kRowTile ? r1 - rt : kRowTile);
    float acc[kRowTile];
#pragma unroll
    for (int i = 0; i < kRowTile; ++i) acc[i] = 0.0f;
    for (int64_t c = tid; c < nch; c += 2 * kThreads) {
      // Two chunks per iteration, all loads issued before the arithmetic.
      const int64_t c2 = c + kThreads;
      const bool has2 = c2 < nch;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const WeightChunk<W> w0 = load_w_chunk(wrow, c);
      const WeightChunk<W> w1 = has2 ? load_w_chunk(wrow, c2) : WeightChunk<W>{};
      uint4 x0[kRowTile], x1[kRowTile];
#pragma unroll
      for (int i = 0; i < kRowTile; ++i) {
        x0[i] = zero;
        x1[i] = zero;
        if (i < nr) {
          const uint16_t* xr = p.x + (rt + i) * p.ldx;
          x0[i] = ld16(xr + c * 8);
          if (has2) x1[i] = ld16(xr + c2 * 8);
        }
      }
      float wf[8];
      unpack_w(w0, wf);
#pragma unroll
      for (int i = 0; i < kRowTile; ++i)
        if (i < nr) acc[i] = dot8(acc[i], x0[i], wf);
      if (has2) {
        unpack_w(w1, wf);
#pragma unroll
        for (int i = 0; i < kRowTile; ++i)
          if (i < nr) acc[i] = dot8(acc[i], x1[i], wf);
      }
    }
#pragma unroll
    for (int i = 0; i < kRowTile; ++i) {
      if (i < nr) {  // uniform over the block
        float v = acc[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[buf][warp][i] = v;
      }
    }
    // One barrier per tile: red is double-buffered, and the readers of tile t have passed the
    // barrier of tile t + 1 before tile t + 2 writes the same buffer.
    __syncthreads();
    if (tid < nr) {
      float s = red[buf][0][tid];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) s += red[buf][w][tid];
      p.logits[(rt + tid) * p.num_experts + e] = s;
    }
  }

  // ---- Arrival: the logit writers (threads < kRowTile) fence their stores at device scope, the
  // barrier orders them before thread 0's fence + atomic (the threadFenceReduction / grid-sync
  // pattern). The CTA that takes the last ticket sees every CTA's logits.
  if (tid < kRowTile) __threadfence();
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    const unsigned total = gridDim.x * gridDim.y;
    s_last = atomicAdd(p.counter, 1u) == total - 1u ? 1 : 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  // ---- Phase 2 (last CTA only): top-k, one warp per row. Logits written by other CTAs are read
  // through L2 (ld.global.cg), never a possibly stale L1 line.
  for (int64_t r = warp; r < p.rows; r += kWarps) {
    const float* l = p.logits + r * p.num_experts;
    routing::router_topk_row<kPer>([l](int x) { return __ldcg(l + x); }, p.bias, p.num_experts,
                                   p.top_k, p.scaling, p.topk_ids + r * p.top_k,
                                   p.topk_w + r * p.top_k, s_ids + r * p.top_k);
    __syncwarp();  // lane 0 wrote the slots; the warp goes on together
  }
  __syncthreads();  // s_ids complete
  if (!p.topk_only)
    routing::group_by_expert_block(s_ids, p.rows * p.top_k,
                                   p.group_experts > 0 ? p.group_experts : p.num_experts, s_offs,
                                   s_warp_sums, p.group_offsets, p.sorted_rows, p.active_groups,
                                   p.group_base);
  // Every other CTA has taken its ticket, so nobody reads the counter any more in this launch.
  if (tid == 0) *p.counter = 0u;
  pdl_launch_dependents();
}

template <typename W>
Status launch_typed(const MoeRouteParams& p, const W* w, CUstream_st* stream) {
  const dim3 grid(static_cast<unsigned>(p.num_experts),
                  static_cast<unsigned>((p.rows + kRowBlock - 1) / kRowBlock));
  switch (routing::experts_per_lane(p.num_experts)) {
    case 4:
      M3_CUDA_RETURN_IF_ERROR(
          launch_kernel(p.pdl, moe_route_kernel<4, W>, grid, dim3(kThreads), 0, stream, p, w));
      break;
    case 8:
      M3_CUDA_RETURN_IF_ERROR(
          launch_kernel(p.pdl, moe_route_kernel<8, W>, grid, dim3(kThreads), 0, stream, p, w));
      break;
    default:
      M3_CUDA_RETURN_IF_ERROR(
          launch_kernel(p.pdl, moe_route_kernel<16, W>, grid, dim3(kThreads), 0, stream, p, w));
      break;
  }
  return Status::ok();
}

}  // namespace

Status launch_moe_route(const MoeRouteParams& p, CUstream_st* stream) {
  const auto bad = [](const std::string& why) {
    return invalid_argument("[cuda.moe_route] " + why);
  };
  if (p.rows < 0 || p.rows > kMaxRows)
    return bad("rows " + std::to_string(p.rows) + " outside [0, 256]");
  if (p.num_experts <= 0 || p.num_experts > routing::kMaxExperts)
    return bad("num_experts " + std::to_string(p.num_experts) + " outside [1, 512]");
  if (p.top_k <= 0 || p.top_k > routing::kMaxTopK || p.top_k > p.num_experts)
    return bad("top_k " + std::to_string(p.top_k) + " outside [1, min(16, num_experts)]");
  if (p.hidden <= 0 || p.hidden % 8 != 0)
    return bad("hidden " + std::to_string(p.hidden) + " is not a positive multiple of 8");
  if (p.ldx < p.hidden || p.ldx % 8 != 0)
    return bad("ldx " + std::to_string(p.ldx) + " is below hidden or not a multiple of 8");
  if ((p.w == nullptr) == (p.w_f32 == nullptr))
    return bad(p.w == nullptr ? "no router weight (w or w_f32)"
                              : "both w (bf16) and w_f32 set; exactly one router weight");
  if (p.x == nullptr || p.logits == nullptr) return bad("null input or logits pointer");
  if (p.topk_ids == nullptr || p.topk_w == nullptr || p.counter == nullptr)
    return bad("null top-k output or counter pointer");
  if (p.group_experts < 0 || p.group_base < 0 || p.group_base + p.group_experts > p.num_experts)
    return bad("grouped experts [" + std::to_string(p.group_base) + ", " +
               std::to_string(p.group_base + p.group_experts) + ") outside [0, num_experts " +
               std::to_string(p.num_experts) + ")");
  if (!p.topk_only &&
      (p.group_offsets == nullptr || p.sorted_rows == nullptr || p.active_groups == nullptr))
    return bad("null grouping output pointer");
  const void* wptr = p.w != nullptr ? static_cast<const void*>(p.w) : p.w_f32;
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || reinterpret_cast<uintptr_t>(wptr) % 16 != 0)
    return bad("x and the router weight (w or w_f32) must be 16-byte aligned");
  if (p.rows == 0) return Status::ok();
  if (p.w_f32 != nullptr) return launch_typed(p, p.w_f32, stream);
  return launch_typed(p, p.w, stream);
}

}  // namespace m3::cuda
