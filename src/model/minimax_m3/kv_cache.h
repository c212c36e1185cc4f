// KV-cache storage for the MiniMax-M3 text model, kept apart from allocation policy.
//
// PagedKvCache owns the memory: per layer, K and V [P, S, Hkv, D] (after k_norm + RoPE) and, on
// sparse layers, the index keys [P, S, Dix] (after index_k_norm + RoPE). S = index_block_size, so
// one page is one MSA block and a page id covers K, V and the index keys of that block in every
// layer (m3-architecture.md §3.6). Which pages belong to which sequence is the caller's business:
// it passes a block table (logical block -> page id) with every forward call; the engine's page
// pool (kv/page_pool.h) hands the pages out.
//
// The storage dtype is --kv-cache-dtype (quant/kv_quant.h): float32 (the reference), bf16, or
// FP8 / NVFP4 codes with their scales; the backend's kv_write quantises and its indexer and
// attention dequantise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/model_config.h"

namespace m3::minimax_m3 {

class PagedKvCache {
 public:
  PagedKvCache(Backend* backend, const MiniMaxM3Config& cfg, int64_t num_pages,
               KvCacheDtype dtype = KvCacheDtype::kFloat32);

  int64_t num_pages() const { return num_pages_; }
  int64_t page_size() const { return page_size_; }
  KvCacheDtype dtype() const { return dtype_; }
  // Bytes per page over all layers (K, V and index keys, with their scales), as allocated.
  int64_t bytes_per_page() const { return bytes_per_page_; }
  KvLayerView layer(int64_t i);

  // One page of every layer (K, V, then the index keys on sparse layers, layer by layer; a
  // quantised tensor as its codes, block scales and page-head scales) to or from bytes_per_page()
  // bytes of host memory, through the backend's copies.
  void save_page(int64_t page, std::byte* host);
  void load_page(int64_t page, const std::byte* host);

 private:
  // One of K, V, index keys in a quantised dtype.
  struct QuantTensor {
    DeviceBuffer<uint8_t> codes, block_scales;
    DeviceBuffer<float> page_scales;
    KvQuantStore view() {
      return {codes.data(), block_scales.data(), page_scales.data()};
    }
  };
  struct Layer {
    DeviceBuffer<float> k, v, idx_k;  // float32
    QuantTensor kq, vq, iq;           // other dtypes
  };
  // Allocates one quantised tensor of `heads` x `dim` per token; returns its bytes per page.
  int64_t alloc_quant(Backend* backend, QuantTensor* t, int64_t heads, int64_t dim);
  // copy(device pointer, bytes) for each contiguous run of page `page`, in save_page's order.
  template <typename CopyFn>
  void for_each_page_run(int64_t page, CopyFn&& copy);

  Backend* backend_;
  KvCacheDtype dtype_;
  int64_t num_pages_, page_size_, num_kv_heads_, head_dim_, index_head_dim_;
  int64_t bytes_per_page_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace m3::minimax_m3
