#include "model/minimax_m3/kv_cache.h"

#include <string>

namespace m3::minimax_m3 {

PagedKvCache::PagedKvCache(Backend* backend, const MiniMaxM3Config& cfg, int64_t num_pages,
                           KvCacheDtype dtype)
    : backend_(backend),
      dtype_(dtype),
      num_pages_(num_pages),
      page_size_(cfg.index_block_size),
      num_kv_heads_(cfg.num_key_value_heads),
      head_dim_(cfg.head_dim),
      index_head_dim_(cfg.index_head_dim) {
  const int64_t kv = num_pages * page_size_ * num_kv_heads_ * head_dim_;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    Layer l;
    const bool sparse = cfg.layer_types[i] == AttentionKind::kSparse;
    if (dtype == KvCacheDtype::kFloat32) {
      l.k = DeviceBuffer<float>(backend, kv);
      l.v = DeviceBuffer<float>(backend, kv);
      bytes_per_page_ += 2 * page_size_ * num_kv_heads_ * head_dim_ * int64_t(sizeof(float));
      if (sparse) {
        l.idx_k = DeviceBuffer<float>(backend, num_pages * page_size_ * index_head_dim_);
        bytes_per_page_ += page_size_ * index_head_dim_ * int64_t(sizeof(float));
      }
    } else {
      bytes_per_page_ += alloc_quant(backend, &l.kq, num_kv_heads_, head_dim_);
      bytes_per_page_ += alloc_quant(backend, &l.vq, num_kv_heads_, head_dim_);
      if (sparse) bytes_per_page_ += alloc_quant(backend, &l.iq, 1, index_head_dim_);
    }
    layers_.push_back(std::move(l));
  }
}

int64_t PagedKvCache::alloc_quant(Backend* backend, QuantTensor* t, int64_t heads, int64_t dim) {
  M3_CHECK(dim % kKvFp4BlockSize == 0,
           "[kv_cache] head dim " + std::to_string(dim) + " is not a multiple of 16");
  const int64_t rows_per_page = page_size_ * heads;
  const int64_t code = rows_per_page * kv_row_code_bytes(dtype_, dim);
  const int64_t block = rows_per_page * kv_row_block_scale_bytes(dtype_, dim);
  const int64_t scale = kv_has_page_scale(dtype_) ? heads : 0;
  t->codes = DeviceBuffer<uint8_t>(backend, num_pages_ * code);
  t->block_scales = DeviceBuffer<uint8_t>(backend, num_pages_ * block);
  t->page_scales = DeviceBuffer<float>(backend, num_pages_ * scale);
  return code + block + scale * int64_t(sizeof(float));
}

KvLayerView PagedKvCache::layer(int64_t i) {
  Layer& l = layers_.at(static_cast<size_t>(i));
  KvLayerView v{l.k.data(), l.v.data(), l.idx_k.empty() ? nullptr : l.idx_k.data(),
                num_pages_, page_size_, num_kv_heads_, head_dim_, index_head_dim_};
  v.dtype = dtype_;
  if (dtype_ != KvCacheDtype::kFloat32) {
    v.kq = l.kq.view();
    v.vq = l.vq.view();
    v.iq = l.iq.view();
  }
  return v;
}

// A page of every layer's K, V and index keys, in layer order: float32 values, or a quantised
// tensor's codes, fp4 block scales and page-head scales (the bytes alloc_quant counts per page).
template <typename CopyFn>
void PagedKvCache::for_each_page_run(int64_t page, CopyFn&& copy) {
  const int64_t kv = page_size_ * num_kv_heads_ * head_dim_;
  const int64_t ix = page_size_ * index_head_dim_;
  auto quant = [&](QuantTensor& t, int64_t heads, int64_t dim) {
    const int64_t rows = page_size_ * heads;
    const int64_t code = rows * kv_row_code_bytes(dtype_, dim);
    const int64_t block = rows * kv_row_block_scale_bytes(dtype_, dim);
    copy(static_cast<void*>(t.codes.data() + page * code), code);
    if (block > 0) copy(static_cast<void*>(t.block_scales.data() + page * block), block);
    if (kv_has_page_scale(dtype_))
      copy(static_cast<void*>(t.page_scales.data() + page * heads),
           heads * int64_t(sizeof(float)));
  };
  for (Layer& l : layers_) {
    if (dtype_ == KvCacheDtype::kFloat32) {
      copy(static_cast<void*>(l.k.data() + page * kv), kv * int64_t(sizeof(float)));
      copy(static_cast<void*>(l.v.data() + page * kv), kv * int64_t(sizeof(float)));
      if (!l.idx_k.empty())
        copy(static_cast<void*>(l.idx_k.data() + page * ix), ix * int64_t(sizeof(float)));
    } else {
      quant(l.kq, num_kv_heads_, head_dim_);
      quant(l.vq, num_kv_heads_, head_dim_);
      if (!l.iq.codes.empty()) quant(l.iq, 1, index_head_dim_);
    }
  }
}

void PagedKvCache::save_page(int64_t page, std::byte* host) {
  M3_CHECK(page >= 0 && page < num_pages_, "[kv_cache.save_page] page " + std::to_string(page));
  for_each_page_run(page, [&](void* device, int64_t bytes) {
    backend_->copy_to_host(host, device, bytes);
    host += bytes;
  });
}

void PagedKvCache::load_page(int64_t page, const std::byte* host) {
  M3_CHECK(page >= 0 && page < num_pages_, "[kv_cache.load_page] page " + std::to_string(page));
  for_each_page_run(page, [&](void* device, int64_t bytes) {
    backend_->copy_to_device(device, host, bytes);
    host += bytes;
  });
}

}  // namespace m3::minimax_m3
