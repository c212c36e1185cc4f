// The request from the composition root to the real-shape CUDA runner's factory: its KV pool
// and its GPU ranks.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/status.h"
#include "quant/kv_quant.h"

namespace m3::app {

struct JoinedGpuNodes;  // app/multi_node.h

// A device's memory after the weights were loaded and a profile step ran (bytes): all of it, the
// weights, everything else in use (the working memory the KV pool must leave room for), and what
// was free (the most the pool can have, whatever the fraction asks).
struct MeasuredMemory {
  int64_t total_bytes = 0, weight_bytes = 0, working_bytes = 0, free_bytes = 0;
};

// How the real-shape CUDA runner sizes its KV pool: `kv_cache_bytes` > 0 exactly; else it loads
// the weights, runs a profile step of `profile_tokens` tokens, and makes a pool of
// plan_pool_bytes(what it measured) bytes (CudaM3Options::kv_pages_after_profile).
struct CudaKvPoolRequest {
  int64_t kv_cache_bytes = 0;
  int64_t profile_tokens = 0;
  std::function<Result<int64_t>(const MeasuredMemory&)> plan_pool_bytes;
  // --tp N: one rank per GPU 0 .. N-1 of this process over NCCL, whose collectives fail after
  // dist_timeout (--dist-timeout). The pool is per rank: every rank holds its KV heads of every
  // page, and the measured plan takes the fewest pages any rank can hold.
  int tensor_parallel = 1;
  // --ep: the expert-parallel ranks among them (divides tensor_parallel): each GPU holds only its
  // block of whole routed experts (model/minimax_m3/cuda/cuda_m3_model.h, CudaTensorParallel).
  int expert_parallel = 1;
  // --enable-dp-attention --dp: attention groups of tensor_parallel / dp_attention GPUs (divides
  // it), each with its own pool of the planned pages (a GPU's page is its group's share of the KV
  // heads; CudaRanks::dp).
  int dp_attention = 1;
  std::chrono::seconds dist_timeout{300};
  bool custom_all_reduce = true;  // small all-reduces over peer memory (CudaRanks)
  int64_t max_decode_rows = 0;    // --cuda-graph-max-bs; 0: CudaM3Options' default
  // --kv-cache-dtype: kBF16 (auto), kFp8E4M3 or kFp4E2M1.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBF16;
  // --nnodes: this node's share of the ranks (its GPUs are ranks nodes->ranks.first ..), joined
  // through the rendezvous; null: every rank in this process. The factory sizes the pool as node
  // 0 does (JoinedGpuNodes::share_pool: node 0 publishes kv_cache_bytes / profile_tokens, the
  // others take them), so every GPU runs the same profile step.
  std::shared_ptr<JoinedGpuNodes> nodes;
  // --speculative-algorithm: the GPU draft beside rank 0 reads the whole embedding and head, so
  // rank 0 holds them whole (the other ranks their vocabulary slice; CudaRanks).
  bool whole_vocab_on_rank0 = false;
};

}  // namespace m3::app
