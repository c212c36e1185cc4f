// Greedy sampling on the GPU: per row, the index of the largest logit (ties: the lowest id, as
// torch.argmax and the CPU sampler), so decode does not copy [B, V] logits to the host. NaN
// logits never win. This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct ArgmaxParams {
  const float* logits = nullptr;  // [B, V] float32, row stride ld
  int64_t batch = 0, vocab = 0, ld = 0;
  int32_t* out = nullptr;         // [B] token ids (-1 when a row has no non-NaN logit)
};

Status launch_argmax(const ArgmaxParams& p, CUstream_st* stream);

}  // namespace m3::cuda
