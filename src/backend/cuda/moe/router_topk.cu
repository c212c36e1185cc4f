// Sigmoid top-k router (float32): the same selection rule, tie-break and weight formula as the
// CPU reference (choice = σ(logit) + bias, ties to the lower expert id; weights renormalise the
// unbiased σ over the chosen experts in selection order, times the scaling factor; slots sorted
// by expert id).
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 16;

// One warp per token row: each lane owns experts lane, lane + 32, ...; k rounds of a warp argmax.
__global__ void router_topk_kernel(RouterTopkParams p) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (r >= p.m) return;
  constexpr int kPer = kMaxExperts / 32;
  float sig[kPer], choice[kPer];
  const float* l = p.logits + r * p.num_experts;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    if (e < p.num_experts) {
      sig[j] = 1.0f / __fadd_rn(1.0f, expf(-l[e]));
      choice[j] = p.bias != nullptr ? __fadd_rn(sig[j], p.bias[e]) : sig[j];
    } else {
      sig[j] = 0.0f;
      choice[j] = -INFINITY;
    }
  }
  int ids[kMaxTopK];
  float sel_sig[kMaxTopK];
  float denom = 0.0f;
  for (int k = 0; k < p.top_k; ++k) {
    // Lane-local best (lower id wins ties: ids grow with j), then warp argmax.
    float best = -INFINITY;
    int best_e = 0x7fffffff;
    float best_sig = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = lane + 32 * j;
      if (e < p.num_experts && (choice[j] > best || (choice[j] == best && e < best_e))) {
        best = choice[j];
        best_e = e;
        best_sig = sig[j];
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      const float os = __shfl_xor_sync(0xffffffffu, best_sig, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
        best_sig = os;
      }
    }
    ids[k] = best_e;
    sel_sig[k] = best_sig;
    denom = __fadd_rn(denom, best_sig);
    // The owner lane removes the chosen expert (NaN never wins a comparison).
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (lane + 32 * j == best_e) choice[j] = __int_as_float(0x7fc00000);
  }
  if (lane != 0) return;
  // Insertion sort of the chosen slots by expert id.
  for (int a = 1; a < p.top_k; ++a) {
    const int e = ids[a];
    const float sg = sel_sig[a];
    int b = a - 1;
    while (b >= 0 && ids[b] > e) {
      ids[b + 1] = ids[b];
      sel_sig[b + 1] = sel_sig[b];
      --b;
    }
    ids[b + 1] = e;
    sel_sig[b + 1] = sg;
  }
  for (int k = 0; k < p.top_k; ++k) {
    p.topk_ids[r * p.top_k + k] = ids[k];
    p.topk_weights[r * p.top_k + k] = __fmul_rn(sel_sig[k] / denom, p.scaling);
  }
}

}  // namespace

Status launch_router_topk(const RouterTopkParams& p, cudaStream_t s) {
  if (p.m == 0) return Status::ok();
  if (p.num_experts <= 0 || p.num_experts > kMaxExperts || p.top_k <= 0 || p.top_k > kMaxTopK ||
      p.top_k > p.num_experts)
    return invalid_argument("[cuda.router_topk] unsupported num_experts " +
                            std::to_string(p.num_experts) + " / top_k " + std::to_string(p.top_k));
  constexpr int kWarps = 4;
  router_topk_kernel<<<static_cast<unsigned>((p.m + kWarps - 1) / kWarps), 32 * kWarps, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(router_topk_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
