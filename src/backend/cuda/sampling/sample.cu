// GPU sampling, kOneCtaPerRow (see sample.h): one CTA of 1024 threads per row (greedy rows: up to
// kSampleGreedySplits), the selection of sample_select.cuh over the whole row. launch_sample
// dispatches to kMultiCta (sample_multi_cta.cu) when asked for and given its workspace.
#include "backend/cuda/sampling/sample.h"

#include <cuda_runtime.h>

#include <climits>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/sampling/sample_select.cuh"

namespace m3::cuda {
namespace sample_detail {
namespace {

__global__ void __launch_bounds__(kThreads) sample_kernel(SampleParams p) {
  __shared__ Smem sh;
  const int b = blockIdx.x;
  const int v = static_cast<int>(p.vocab);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* row = p.logits + static_cast<int64_t>(b) * p.ld;
  const SampleRowParams rp = p.rows[b];
  uint8_t* mask = p.kept_mask ? p.kept_mask + static_cast<int64_t>(b) * p.vocab : nullptr;

  // A row's CTAs (gridDim.y > 1 only with the greedy scratch): non-greedy rows take one.
  const int slice = blockIdx.y, slices = gridDim.y;
  if (rp.temperature < 1e-5f) {  // greedy: argmax, ties to the lowest id, NaN never wins
    const int lo = static_cast<int>(int64_t{v} * slice / slices);
    const int hi = static_cast<int>(int64_t{v} * (slice + 1) / slices);
    float bv = -INFINITY;
    int bi = INT_MAX;
    // Four loads in flight per thread before the compares (one latency per 4K logits).
    for (int i0 = lo + tid; i0 < hi; i0 += 4 * kThreads) {
      float x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = i0 + j * kThreads < hi ? row[i0 + j * kThreads] : 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = i0 + j * kThreads;
        if (i < hi && (x[j] > bv || (x[j] == bv && i < bi))) bv = x[j], bi = i;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, o);
      const int oi = __shfl_xor_sync(kFull, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == 0) sh.fred[warp] = bv, sh.ired[warp] = bi;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < kWarps; ++w)
        if (sh.fred[w] > bv || (sh.fred[w] == bv && sh.ired[w] < bi)) bv = sh.fred[w], bi = sh.ired[w];
      sh.last_slice = true;
      if (slices > 1) {
        // This slice's result, then a ticket; the last slice's CTA reduces them all.
        const int64_t at = int64_t{b} * slices + slice;
        p.greedy_value[at] = bv;
        p.greedy_index[at] = bi;
        __threadfence();
        sh.last_slice = atomicAdd(&p.greedy_tickets[b], 1u) == static_cast<uint32_t>(slices - 1);
        if (sh.last_slice) {
          __threadfence();
          for (int s = 0; s < slices; ++s) {
            const float ov = __ldcg(p.greedy_value + int64_t{b} * slices + s);
            const int oi = __ldcg(p.greedy_index + int64_t{b} * slices + s);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
          }
          p.greedy_tickets[b] = 0;  // for the next launch (graph replays)
        }
      }
      sh.found = bi == INT_MAX ? -1 : bi;
      if (sh.last_slice) p.out[b] = sh.found;
    }
    __syncthreads();
    if (mask && sh.last_slice)
      for (int i = tid; i < v; i += kThreads) mask[i] = i == sh.found ? 1 : 0;
    return;
  }
  if (slice > 0) return;
  select_and_draw(RowSource{row, 1.0f / rp.temperature, v}, rp, rp.top_k, false, 0.0, nullptr, 0, mask,
                  p.out + b, sh);
}

}  // namespace

Status launch_sample_one_cta(const SampleParams& p, cudaStream_t stream) {
  const int n_scratch = (p.greedy_value != nullptr) + (p.greedy_index != nullptr) +
                        (p.greedy_tickets != nullptr);
  if (n_scratch != 0 && n_scratch != 3)
    return invalid_argument("[cuda.sample] greedy_value, greedy_index and greedy_tickets go together");
  const unsigned slices = n_scratch == 3 ? static_cast<unsigned>(kSampleGreedySplits) : 1u;
  sample_kernel<<<dim3(static_cast<unsigned>(p.batch), slices), kThreads, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(sample_kernel);
  return Status::ok();
}

}  // namespace sample_detail

Status launch_sample(const SampleParams& p, CUstream_st* stream) {
  if (p.batch == 0) return Status::ok();
  if (p.vocab <= 0 || p.vocab > INT_MAX / 2 || p.ld < p.vocab)
    return invalid_argument("[cuda.sample] bad vocab " + std::to_string(p.vocab) +
                            " / row stride " + std::to_string(p.ld));
  if (p.rows == nullptr || p.out == nullptr || p.logits == nullptr)
    return invalid_argument("[cuda.sample] logits, rows and out are required");
  if (p.batch > INT_MAX) return invalid_argument("[cuda.sample] batch too large");
  if (p.kernel == SampleKernel::kMultiCta) {
    const SampleMultiCtaWorkspace& w = p.multi;
    const int n_ws = (w.cand_z != nullptr) + (w.cand_id != nullptr) + (w.slice_max != nullptr) +
                     (w.slice_arg != nullptr) + (w.slice_cut != nullptr) +
                     (w.slice_mass != nullptr) + (w.tickets != nullptr);
    if (n_ws != 0 && n_ws != 7)
      return invalid_argument("[cuda.sample] the kMultiCta workspace is all seven buffers or none");
    if (n_ws == 7 && p.batch > w.max_batch)
      return invalid_argument("[cuda.sample] batch " + std::to_string(p.batch) +
                              " above the kMultiCta workspace's " + std::to_string(w.max_batch));
    const int64_t splits = sample_multi_cta_splits(p.batch, p.vocab);
    if (n_ws == 7 && splits >= 2) return sample_detail::launch_sample_multi_cta(p, splits, stream);
  }
  return sample_detail::launch_sample_one_cta(p, stream);
}

}  // namespace m3::cuda
