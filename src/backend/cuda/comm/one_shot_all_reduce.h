// One-shot all-reduce of small float32 messages among the GPU ranks of one process, through peer
// memory (NVLink): the decode step's all-reduces (batch x hidden floats, 24 KB at one row), where
// NCCL's latency, not bandwidth, is the cost (two per layer, 120 per M3.1-Flash step). TensorRT-LLM
// and SGLang ship the same idea as their "custom all-reduce".
//
// Each rank's kernel copies its message into its own staging buffer, tells every rank it has,
// waits until every rank has told it, then reads every rank's staging buffer (over NVLink) and
// sums them in rank order, so every rank gets the same bits. One kernel, no host involvement:
// it is queued on the rank's stream and captured into CUDA graphs. Per CTA slice: the CTAs of a
// launch synchronise only with the same CTA of the other ranks (flags per (rank, CTA)), carrying
// an epoch that each launch reads from and advances in device memory, so graph replays need no
// new arguments. Two staging buffers alternate by epoch: a rank starting launch e has seen every
// rank start launch e - 1, whose stream had then finished e - 2, the last reader of this buffer.
//
// A rank that never arrives (it died, or stopped calling) does not hang the others: a CTA that
// waits longer than the timeout records an error, which error() then reports, and leaves with
// a wrong result. The group is unusable after that.
//
// Ranks may share a device (the tests run two on one GPU); ranks on different devices need peer
// access between them (create() fails unavailable otherwise: then use NCCL). This header includes
// no CUDA header.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/norm/add_rms_norm.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct OneShotOptions {
  int64_t max_elements = int64_t{1} << 19;  // the largest message (float32 elements): 2 MiB
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

class OneShotAllReduce {
 public:
  static constexpr int kMaxRanks = 8;
  static constexpr int kMaxCtas = 32;

  // Rank r on devices[r] (2 to kMaxRanks ranks): every rank's staging buffers and flags, and
  // peer access between every pair of devices.
  static Result<std::shared_ptr<OneShotAllReduce>> create(const std::vector<int>& devices,
                                                          const OneShotOptions& options = {});
  ~OneShotAllReduce();
  OneShotAllReduce(const OneShotAllReduce&) = delete;
  OneShotAllReduce& operator=(const OneShotAllReduce&) = delete;

  int ranks() const { return static_cast<int>(ranks_.size()); }
  int64_t max_elements() const { return options_.max_elements; }

  // buf[count] (float32, on rank's device) becomes the sum over the ranks, in rank order; queued
  // on `stream`. Every rank makes the same calls with the same counts, each on its own stream;
  // count <= max_elements().
  Status all_reduce(int rank, float* buf, int64_t count, CUstream_st* stream);

  // The decode step's all-reduce fused with the residual add and the next RMSNorm, in one
  // kernel: delta [norm.t, norm.hidden] (this rank's partial sum, left unchanged) is summed over
  // the ranks in rank order (all_reduce's bits), then norm.residual += that sum and norm.out (and
  // the f16 copy where asked) = the Gemma RMSNorm of the new residual, bit for bit what
  // launch_add_rms_norm's one-CTA-per-row kernel (cluster_rows 0) computes from the stored sum.
  // Saves the norm's launch and the round trip of the sum through memory on the critical path.
  // norm.delta and the fused delta sources (delta_partial, moe_contrib) must be unset; hidden a
  // multiple of 4, at most 8192; t · hidden <= max_elements(). Every rank calls it with the same
  // t and hidden (a rank may not mix it with all_reduce for the same message). CTA c takes rows
  // c, c + C, ... (C = min(t, kMaxCtas)) and waits only for the same CTA of the other ranks.
  Status all_reduce_add_rms_norm(int rank, const float* delta, const AddRmsNormParams& norm,
                                 CUstream_st* stream);

  // unavailable, naming the rank, once a launch of `rank` waited longer than the timeout.
  Status error(int rank) const;

 private:
  struct Rank {
    int device = 0;
    float* staging = nullptr;   // [2][max_elements]
    uint32_t* flags = nullptr;  // [kMaxRanks][kMaxCtas]: the epoch each rank's CTA has reached
    uint32_t* epoch = nullptr;  // [0] launches done, [1] CTAs of the current launch done
    int* timed_out = nullptr;   // mapped host memory, set by a CTA that waited too long
  };
  OneShotAllReduce() = default;

  OneShotOptions options_;
  std::vector<Rank> ranks_;
};

}  // namespace m3::cuda
