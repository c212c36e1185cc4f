// A GPU rank's communicator whose small float32 sums go through the one-shot all-reduce over peer
// memory (one_shot_all_reduce.h) and everything else, including larger sums, through `inner`
// (NCCL). Both queue on the rank's stream, so they order with each other and with the kernels;
// synchronize() is inner's watchdog, then the one-shot kernels' own timeout report. This header
// includes no CUDA header.
#pragma once

#include <memory>

#include "backend/comm/communicator.h"
#include "backend/cuda/comm/one_shot_all_reduce.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::comm {

// Sums of at most one_shot->max_elements() float32 elements take the one-shot path.
std::unique_ptr<Communicator> with_one_shot_all_reduce(
    std::unique_ptr<Communicator> inner, std::shared_ptr<cuda::OneShotAllReduce> one_shot,
    CUstream_st* stream);

}  // namespace m3::comm
