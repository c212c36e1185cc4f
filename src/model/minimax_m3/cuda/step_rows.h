// Where each slice's tokens sit in the rows of one step of the real-shape CUDA model
// (CudaM3Model::forward), with or without attention data parallelism. No CUDA here: unit-tested
// on the CPU (tests/model_cuda/step_rows_test.cpp).
//
// Without --dp (dp = 1) the rows are the slices' tokens, one-token slices (decode rows) first, then
// the longer ones, each slice's tokens consecutive: the decode kernels take the first rows, each
// prefill chunk its own range.
//
// With --enable-dp-attention --dp D the step's rows are every group's rows, group by group, each
// group's laid out as above. Every GPU rank holds all of them (its residual stream is every
// group's), and runs on them everything but attention; attention (q|k|v, the indexer, the KV
// writes, o_proj) runs on its own group's rows only. That is what lets the attention all-reduce
// inside a group and the gather of the groups' rows before the feed-forward block be one
// all-reduce over all ranks (cuda_m3_model.h, CudaTensorParallel::dp), and the head run on rank 0
// for every group's rows.
//
// Group g's rows start at g * stride with a stride: 0 packs the groups (group g right after
// group g - 1's tokens: the general path, whose shapes may change every step), a positive one
// gives every group the same `stride` rows (the decode path: the rows, and so the collectives'
// message and the CUDA graph of the step, depend only on the largest group's tokens, padded to
// the batch bucket). Rows beyond a group's tokens are padding (no KV write, no attention).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace m3::minimax_m3 {

struct StepRowSlice {
  size_t index = 0;        // in the step's batch
  int32_t group = 0;       // its ModelSlice::dp_group
  int64_t offset = 0;      // its first row
  int64_t tokens = 0;      // its rows: [offset, offset + tokens)
};

struct StepRows {
  std::vector<StepRowSlice> slices;  // in row order
  // Per group: its first row, its tokens (rows [first, first + tokens) hold them, then its
  // padding) and its one-token slices (the first `decode` of its rows).
  std::vector<int64_t> group_first, group_tokens, group_decode;
  int64_t rows = 0;        // the step's rows, padding included
  int64_t max_group = 0;   // the most tokens of any group
};

// The layout of `batch` over `dp` groups (every slice's dp_group must be in [0, dp): the caller
// validates it) with group stride `stride` (0: packed; else at least every group's tokens).
StepRows plan_step_rows(std::span<const ModelSlice> batch, int dp, int64_t stride = 0);

// The decode path's group stride for a step whose largest group has `max_group` tokens: the
// batch bucket (the next power of two), at most `decode_rows` / dp (the decode buffers' rows
// shared by the groups); 0 when max_group exceeds that (the step takes the general path). With
// dp = 1 the step's rows are min(next_pow2(tokens), decode_rows), the one-rank bucket.
int64_t decode_group_stride(int64_t max_group, int dp, int64_t decode_rows);

}  // namespace m3::minimax_m3
