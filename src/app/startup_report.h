// What `m3serve serve` says about the model it loaded, before it reports ready: the checkpoint's
// weight formats by role, where the weights and the KV cache live, how large the pool is, and the
// checkpoint bytes each rank read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/weight_source.h"
#include "quant/kv_quant.h"

namespace m3::app {

// The storage formats of the text model's weights by role, e.g. "MXFP8 dense linears, NVFP4
// routed experts, BF16 embeddings and head" ("BF16/MXFP8 dense linears" where a role is mixed).
// Norms, the router and biases are not counted.
std::string weight_formats_summary(const WeightSource& weights);

// The checkpoint bytes this process's ranks read while loading (measured: ReadCounter::Scope
// around each rank's load; on the CPU a rank maps the checkpoint and reads only its slices):
// "checkpoint read: 17.0 MB by rank 0 (17023136 bytes), 17.0 MB by rank 1 (17023136 bytes) of
// 29.7 MB stored" for ranks first_rank, first_rank + 1, ...; `stored_bytes` is the checkpoint's
// size. The exact count is given so that it can be checked against the slices.
std::string weights_read_summary(int first_rank, const std::vector<uint64_t>& bytes_per_rank,
                                 uint64_t stored_bytes);

// The stored bytes of every tensor of `weights` when it is a checkpoint (Checkpoint), else 0
// (dummy weights read no file).
uint64_t checkpoint_stored_bytes(const WeightSource& weights);

// The KV pool in one phrase: "kv dtype fp8_e4m3 (69136.875 bytes per token), 4096 tokens fit" —
// the storage dtype, the bytes a token takes over all layers with the page scales spread over the
// page (bytes_per_page / page_size, exact to 1/page_size), and the pool's token capacity.
std::string kv_pool_summary(KvCacheDtype dtype, int64_t bytes_per_page, int32_t page_size,
                            int64_t max_tokens);

}  // namespace m3::app
