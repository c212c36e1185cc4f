#include "model/minimax_m3/dspark/dspark_kv_cache.h"

#include <algorithm>
#include <string>

namespace m3::minimax_m3::dspark {

DSparkContextCache::DSparkContextCache(Backend* backend, const DSparkConfig& cfg, int64_t page_size)
    : backend_(backend),
      page_size_(page_size),
      window_(cfg.sliding_window),
      num_kv_heads_(cfg.num_key_value_heads),
      head_dim_(cfg.head_dim) {
  M3_CHECK(page_size_ > 0, "[dspark.cache] page size must be positive");
  // Held positions span [length - W - S, length): at most ceil((W + S) / S) + 1 blocks.
  capacity_ = (window_ + page_size_ - 1) / page_size_ + 3;
  const int64_t n = capacity_ * page_size_ * num_kv_heads_ * head_dim_;
  for (int64_t l = 0; backend_ != nullptr && l < cfg.num_hidden_layers; ++l) {
    k_.emplace_back(backend_, n);
    v_.emplace_back(backend_, n);
  }
  for (int64_t p = capacity_ - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int64_t DSparkContextCache::release_bound(int64_t length) const {
  return length - window_ - page_size_;
}

int64_t DSparkContextCache::first_held_position() const {
  return first_block_ * page_size_;
}

int64_t DSparkContextCache::first_needed_position(int64_t new_length) const {
  return std::max<int64_t>(0, release_bound(new_length));
}

KvLayerView DSparkContextCache::layer(int64_t i) {
  M3_CHECK(i >= 0 && i < static_cast<int64_t>(k_.size()),
           "[dspark.cache] layer " + std::to_string(i) + " has no storage here");
  KvLayerView v;
  v.k = k_[static_cast<size_t>(i)].data();
  v.v = v_[static_cast<size_t>(i)].data();
  v.num_pages = capacity_;
  v.page_size = page_size_;
  v.num_kv_heads = num_kv_heads_;
  v.head_dim = head_dim_;
  return v;
}

Status DSparkContextCache::prepare_append(int64_t new_length) {
  if (new_length < length_)
    return invalid_argument("[model.minimax_m3.dspark.cache] append to length " +
                            std::to_string(new_length) + " below the current length " +
                            std::to_string(length_));
  // Release whole blocks behind the bound (block b holds [b·S, (b+1)·S)).
  const int64_t bound = release_bound(new_length);
  while ((first_block_ + 1) * page_size_ <= bound) {
    if (first_block_ < static_cast<int64_t>(table_.size()) && table_[first_block_] >= 0) {
      free_.push_back(table_[first_block_]);
      table_[first_block_] = -1;
    }
    ++first_block_;
  }
  const int64_t blocks = (new_length + page_size_ - 1) / page_size_;
  if (static_cast<int64_t>(table_.size()) < blocks) table_.resize(static_cast<size_t>(blocks), -1);
  // Only the blocks this append writes: released blocks below length_ stay released.
  const int64_t first_written = std::max(first_needed_position(new_length), length_);
  for (int64_t b = first_written / page_size_; b < blocks; ++b) {
    if (table_[b] >= 0) continue;
    M3_CHECK(!free_.empty(),
             "[dspark.cache] page pool exhausted (capacity " + std::to_string(capacity_) + ")");
    table_[b] = free_.back();
    free_.pop_back();
  }
  return Status::ok();
}

Status DSparkContextCache::truncate(int64_t new_length) {
  if (new_length < 0 || new_length > length_)
    return invalid_argument("[model.minimax_m3.dspark.cache] cannot truncate to length " +
                            std::to_string(new_length) + ": the cache holds " +
                            std::to_string(length_) + " positions");
  // A query at new_length reads positions >= new_length - W + 1 (and < new_length).
  const int64_t needed = std::max<int64_t>(0, new_length - window_ + 1);
  if (new_length > 0 && needed < first_held_position())
    return invalid_argument("[model.minimax_m3.dspark.cache] cannot truncate to length " +
                            std::to_string(new_length) + ": its window starts at position " +
                            std::to_string(needed) + ", but positions below " +
                            std::to_string(first_held_position()) + " were released");
  const int64_t blocks = (new_length + page_size_ - 1) / page_size_;
  for (int64_t b = blocks; b < static_cast<int64_t>(table_.size()); ++b)
    if (table_[b] >= 0) free_.push_back(table_[b]);
  table_.resize(static_cast<size_t>(blocks));
  first_block_ = std::min(first_block_, blocks);
  length_ = new_length;
  return Status::ok();
}

}  // namespace m3::minimax_m3::dspark
