// MoE router logits for any number of rows (router_logits.h), bitwise the fused router's
// (moe_route.cu): the same lane sums (chunks of 8, fmas in element order, lanes round robin over
// the chunks) and the same tree over them, the warp butterfly replayed from shared memory by the
// lane that owns the (row, expert) pair.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "backend/cuda/moe/router_logits.h"
#include "backend/cuda/moe/routing_device.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"

namespace m3::cuda {
namespace {

constexpr int kWarpRows = 8;     // rows of a warp's tile
constexpr int kWarpExperts = 4;  // experts of a warp's tile
constexpr int kPairs = kWarpRows * kWarpExperts;
static_assert(kPairs == 32, "one (row, expert) pair per lane for the reduction");
constexpr int kRowWarps = 4;     // warps along the rows of a CTA tile
constexpr int kExpertWarps = 2;  // warps along the experts
constexpr int kWarps = kRowWarps * kExpertWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = kRowWarps * kWarpRows;           // 32
constexpr int kTileExperts = kExpertWarps * kWarpExperts;  // 8

using routing::dot8;
using routing::kDotGroups;
using routing::kDotLanes;
using routing::load_w_chunk;
using routing::unpack_w;
using routing::WeightChunk;

__device__ __forceinline__ uint4 ld16(const uint16_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// One level of the warp butterfly on the 32 lane values held in v: v[t] += v[t + kO], t < kO
// (the value of lane t after the __shfl_xor by kO; lane t + kO would hold the same sum).
template <int kO>
__device__ __forceinline__ void butterfly_level(float (&v)[32]) {
#pragma unroll
  for (int t = 0; t < kO; ++t) v[t] = v[t] + v[t + kO];
}

// Grid (ceil(rows / 32), ceil(E / 8)), kThreads threads; W: the weight's element type (uint16_t:
// bf16, float). Warp (rw, ew) of CTA (bx, by) owns rows bx·32 + rw·8 + [0, 8) and experts
// by·8 + ew·4 + [0, 4); pair o = i·4 + j is (row i, expert j) of that tile, and lane o stores it.
// Rows and experts past the end are computed on the last valid one and not stored.
template <typename W>
__global__ void __launch_bounds__(kThreads)
    router_logits_kernel(RouterLogitsParams p, const W* w, int64_t ld_logits) {
  // Lane sums of the current lane group, [warp][pair][lane] (33: conflict-free both ways).
  __shared__ float lane_sums[kWarps][kPairs][33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = int64_t{blockIdx.x} * kTileRows + (warp % kRowWarps) * kWarpRows;
  const int64_t e0 = int64_t{blockIdx.y} * kTileExperts + (warp / kRowWarps) * kWarpExperts;
  const uint16_t* xr[kWarpRows];
  const W* wr[kWarpExperts];
#pragma unroll
  for (int i = 0; i < kWarpRows; ++i) xr[i] = p.x + (r0 + i < p.rows ? r0 + i : p.rows - 1) * p.ldx;
#pragma unroll
  for (int j = 0; j < kWarpExperts; ++j)
    wr[j] = w + (e0 + j < p.num_experts ? e0 + j : p.num_experts - 1) * p.hidden;
  pdl_wait();

  const int64_t nch = p.hidden / 8;
  float(&sums)[kPairs][33] = lane_sums[warp];
  float total = 0.0f;  // lane o: the sum of the group sums so far of pair o
  for (int g = 0; g < kDotGroups; ++g) {
    // Lane j: lane sum 32g + j of every pair, over the chunks 32g + j + kDotLanes·m in order.
    float acc[kWarpRows][kWarpExperts];
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i)
#pragma unroll
      for (int j = 0; j < kWarpExperts; ++j) acc[i][j] = 0.0f;
    for (int64_t c = int64_t{32} * g + lane; c < nch; c += kDotLanes) {
      uint4 xv[kWarpRows];
#pragma unroll
      for (int i = 0; i < kWarpRows; ++i) xv[i] = ld16(xr[i] + c * 8);
      WeightChunk<W> wc[kWarpExperts];
#pragma unroll
      for (int j = 0; j < kWarpExperts; ++j) wc[j] = load_w_chunk(wr[j], c);
#pragma unroll
      for (int j = 0; j < kWarpExperts; ++j) {
        float wf[8];
        unpack_w(wc[j], wf);
#pragma unroll
        for (int i = 0; i < kWarpRows; ++i) acc[i][j] = dot8(acc[i][j], xv[i], wf);
      }
    }
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i)
#pragma unroll
      for (int j = 0; j < kWarpExperts; ++j) sums[i * kWarpExperts + j][lane] = acc[i][j];
    __syncwarp();
    // Lane o replays the fused router's butterfly on pair o: lane t + lane t + 16 (t < 16), then
    // + 8, + 4, + 2, + 1. Every lane of the butterfly ends with the value lane 0 has; the fused
    // router takes lane 0's.
    float v[32];
#pragma unroll
    for (int t = 0; t < 32; ++t) v[t] = sums[lane][t];
    butterfly_level<16>(v);
    butterfly_level<8>(v);
    butterfly_level<4>(v);
    butterfly_level<2>(v);
    butterfly_level<1>(v);
    // The group sums in group order, the first one as it is (the fused router's s = red[0];
    // s += red[w]).
    total = g == 0 ? v[0] : total + v[0];
    __syncwarp();  // sums is rewritten by the next group
  }
  const int64_t r = r0 + lane / kWarpExperts, e = e0 + lane % kWarpExperts;
  if (r < p.rows && e < p.num_experts) p.logits[r * ld_logits + e] = total;
  pdl_launch_dependents();
}

template <typename W>
Status launch_typed(const RouterLogitsParams& p, const W* w, int64_t ld_logits,
                    CUstream_st* stream) {
  const dim3 grid(static_cast<unsigned>((p.rows + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>((p.num_experts + kTileExperts - 1) / kTileExperts));
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, router_logits_kernel<W>, grid, dim3(kThreads), 0,
                                        stream, p, w, ld_logits));
  return Status::ok();
}

}  // namespace

Status launch_router_logits(const RouterLogitsParams& p, CUstream_st* stream) {
  const auto bad = [](const std::string& why) {
    return invalid_argument("[cuda.router_logits] " + why);
  };
  if (p.rows < 0 || p.rows > std::numeric_limits<int32_t>::max())
    return bad("rows " + std::to_string(p.rows) + " outside [0, 2^31)");
  if (p.num_experts <= 0 || p.num_experts > routing::kMaxExperts)
    return bad("num_experts " + std::to_string(p.num_experts) + " outside [1, 512]");
  if (p.hidden <= 0 || p.hidden % 8 != 0)
    return bad("hidden " + std::to_string(p.hidden) + " is not a positive multiple of 8");
  if (p.ldx < p.hidden || p.ldx % 8 != 0)
    return bad("ldx " + std::to_string(p.ldx) + " is below hidden or not a multiple of 8");
  const int64_t ld_logits = p.ld_logits == 0 ? p.num_experts : p.ld_logits;
  if (ld_logits < p.num_experts)
    return bad("ld_logits " + std::to_string(p.ld_logits) + " is below num_experts");
  if ((p.w == nullptr) == (p.w_f32 == nullptr))
    return bad(p.w == nullptr ? "no router weight (w or w_f32)"
                              : "both w (bf16) and w_f32 set; exactly one router weight");
  if (p.x == nullptr || p.logits == nullptr) return bad("null input or logits pointer");
  const void* wptr = p.w != nullptr ? static_cast<const void*>(p.w) : p.w_f32;
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || reinterpret_cast<uintptr_t>(wptr) % 16 != 0)
    return bad("x and the router weight (w or w_f32) must be 16-byte aligned");
  if (p.rows == 0) return Status::ok();
  if (p.w_f32 != nullptr) return launch_typed(p, p.w_f32, ld_logits, stream);
  return launch_typed(p, p.w, ld_logits, stream);
}

}  // namespace m3::cuda
