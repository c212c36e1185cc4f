// Single-sequence `score` and `generate` on CudaM3Model (the real-shape CUDA path), with the
// semantics of minimax_m3::SequenceRunner::append and minimax_m3::generate (runner.h): prefill in
// chunks, greedy or temperature sampling (the same double-precision inverse-CDF draw from the same
// std::mt19937_64 stream), stop after an EOS token unless ignore_eos. Pages 0.. of the model's
// cache are used in order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/minimax_m3/runner.h"
#include "model/minimax_m3_cuda/cuda_m3_model.h"

namespace m3::minimax_m3 {

// All-token logits [prompt.size(), V] of `prompt` from position 0, in chunks of `chunk` tokens
// (<= 0: one chunk).
Result<std::vector<float>> cuda_score(CudaM3Model* model, std::span<const int32_t> prompt,
                                      int64_t chunk);

Result<std::vector<int32_t>> cuda_generate(CudaM3Model* model, std::span<const int32_t> prompt,
                                           const GenerateOptions& opts);

}  // namespace m3::minimax_m3
