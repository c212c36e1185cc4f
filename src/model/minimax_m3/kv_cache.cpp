#include "model/minimax_m3/kv_cache.h"

#include <string>

namespace m3::minimax_m3 {

PagedKvCache::PagedKvCache(Backend* backend, const MiniMaxM3Config& cfg, int64_t num_pages)
    : backend_(backend),
      num_pages_(num_pages),
      page_size_(cfg.index_block_size),
      num_kv_heads_(cfg.num_key_value_heads),
      head_dim_(cfg.head_dim),
      index_head_dim_(cfg.index_head_dim) {
  const int64_t kv = num_pages * page_size_ * num_kv_heads_ * head_dim_;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    Layer l;
    l.k = DeviceBuffer<float>(backend, kv);
    l.v = DeviceBuffer<float>(backend, kv);
    bytes_per_page_ += 2 * page_size_ * num_kv_heads_ * head_dim_ * int64_t(sizeof(float));
    if (cfg.layer_types[i] == AttentionKind::kSparse) {
      l.idx_k = DeviceBuffer<float>(backend, num_pages * page_size_ * index_head_dim_);
      bytes_per_page_ += page_size_ * index_head_dim_ * int64_t(sizeof(float));
    }
    layers_.push_back(std::move(l));
  }
}

KvLayerView PagedKvCache::layer(int64_t i) {
  Layer& l = layers_.at(static_cast<size_t>(i));
  return {l.k.data(), l.v.data(), l.idx_k.empty() ? nullptr : l.idx_k.data(),
          num_pages_, page_size_, num_kv_heads_, head_dim_, index_head_dim_};
}

void PagedKvCache::save_page(int64_t page, std::byte* host) {
  M3_CHECK(page >= 0 && page < num_pages_, "[kv_cache.save_page] page " + std::to_string(page));
  const int64_t kv = page_size_ * num_kv_heads_ * head_dim_;
  const int64_t ix = page_size_ * index_head_dim_;
  for (Layer& l : layers_) {
    backend_->copy_to_host(host, l.k.data() + page * kv, kv * int64_t(sizeof(float)));
    host += kv * int64_t(sizeof(float));
    backend_->copy_to_host(host, l.v.data() + page * kv, kv * int64_t(sizeof(float)));
    host += kv * int64_t(sizeof(float));
    if (!l.idx_k.empty()) {
      backend_->copy_to_host(host, l.idx_k.data() + page * ix, ix * int64_t(sizeof(float)));
      host += ix * int64_t(sizeof(float));
    }
  }
}

void PagedKvCache::load_page(int64_t page, const std::byte* host) {
  M3_CHECK(page >= 0 && page < num_pages_, "[kv_cache.load_page] page " + std::to_string(page));
  const int64_t kv = page_size_ * num_kv_heads_ * head_dim_;
  const int64_t ix = page_size_ * index_head_dim_;
  for (Layer& l : layers_) {
    backend_->copy_to_device(l.k.data() + page * kv, host, kv * int64_t(sizeof(float)));
    host += kv * int64_t(sizeof(float));
    backend_->copy_to_device(l.v.data() + page * kv, host, kv * int64_t(sizeof(float)));
    host += kv * int64_t(sizeof(float));
    if (!l.idx_k.empty()) {
      backend_->copy_to_device(l.idx_k.data() + page * ix, host, ix * int64_t(sizeof(float)));
      host += ix * int64_t(sizeof(float));
    }
  }
}

}  // namespace m3::minimax_m3
