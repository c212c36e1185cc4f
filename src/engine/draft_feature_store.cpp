#include "engine/draft_feature_store.h"

#include <algorithm>
#include <string>

#include "core/status.h"

namespace m3 {

DraftFeatureStore::DraftFeatureStore(int32_t num_layers, int32_t hidden, int32_t page_size,
                                     int32_t num_pages)
    : num_layers_(num_layers),
      hidden_(hidden),
      page_size_(page_size),
      entries_(static_cast<size_t>(std::max(0, num_pages))) {}

DraftFeatureStore::Entry* DraftFeatureStore::entry(PageId page) {
  if (page < 0 || static_cast<size_t>(page) >= entries_.size()) return nullptr;
  return &entries_[static_cast<size_t>(page)];
}

void DraftFeatureStore::write(std::span<const PageId> pages, int64_t pos, int64_t n,
                              std::span<const float> rows, int64_t T, int64_t first_row) {
  const int64_t P = page_size_, H = hidden_;
  M3_CHECK(first_row >= 0 && first_row + n <= T &&
               rows.size() == static_cast<size_t>(num_layers_ * T * H),
           "[draft_feature_store] " + std::to_string(rows.size()) + " values for " +
               std::to_string(T) + " rows, tokens " + std::to_string(first_row) + " + " +
               std::to_string(n));
  int64_t done = 0;
  while (done < n) {
    const int64_t p = pos + done;
    const int64_t index = p / P, offset = p % P;
    const int64_t m = std::min(n - done, P - offset);
    if (index >= static_cast<int64_t>(pages.size())) return;  // no page: nothing to keep
    Entry* e = entry(pages[static_cast<size_t>(index)]);
    if (e != nullptr) {
      if (e->first_pos != index * P || offset < e->valid) {
        // Another page index (the page was reused) or a rewrite (rollback): restart the entry.
        if (e->first_pos != index * P) e->valid = 0;
        e->first_pos = index * P;
        e->valid = std::min<int32_t>(e->valid, static_cast<int32_t>(offset));
      }
      if (offset == e->valid) {
        if (e->data.empty()) e->data.assign(static_cast<size_t>(num_layers_ * P * H), 0.0f);
        for (int64_t l = 0; l < num_layers_; ++l) {
          std::copy_n(rows.begin() + static_cast<std::ptrdiff_t>((l * T + first_row + done) * H),
                      m * H,
                      e->data.begin() + static_cast<std::ptrdiff_t>((l * P + offset) * H));
        }
        e->valid = static_cast<int32_t>(offset + m);
      }
    }
    done += m;
  }
}

void DraftFeatureStore::invalidate(std::span<const PageId> pages, int64_t pos, int64_t n) {
  const int64_t P = page_size_;
  for (int64_t index = pos / P; index * P < pos + n && index < static_cast<int64_t>(pages.size());
       ++index) {
    Entry* e = entry(pages[static_cast<size_t>(index)]);
    if (e == nullptr) continue;
    const int64_t offset = std::max<int64_t>(0, pos - index * P);
    if (e->first_pos != index * P) {
      e->valid = 0;
    } else {
      e->valid = std::min<int32_t>(e->valid, static_cast<int32_t>(offset));
    }
  }
}

void DraftFeatureStore::adopt(PageId kept, PageId dropped, int64_t index) {
  if (covers(kept, index) || !covers(dropped, index)) return;
  Entry* to = entry(kept);
  Entry* from = entry(dropped);
  std::swap(to->data, from->data);
  to->first_pos = from->first_pos;
  to->valid = from->valid;
  from->valid = 0;
}

bool DraftFeatureStore::covers(PageId page, int64_t index) const {
  if (page < 0 || static_cast<size_t>(page) >= entries_.size()) return false;
  const Entry& e = entries_[static_cast<size_t>(page)];
  return e.first_pos == index * page_size_ && e.valid == page_size_;
}

int32_t DraftFeatureStore::covered_prefix(std::span<const PageId> pages) const {
  int32_t i = 0;
  while (static_cast<size_t>(i) < pages.size() && covers(pages[static_cast<size_t>(i)], i)) ++i;
  return i;
}

std::vector<float> DraftFeatureStore::read(std::span<const PageId> pages,
                                           int64_t num_pages) const {
  const int64_t P = page_size_, H = hidden_, T = num_pages * P;
  M3_CHECK(num_pages <= static_cast<int64_t>(pages.size()),
           "[draft_feature_store] read of " + std::to_string(num_pages) + " pages of " +
               std::to_string(pages.size()));
  std::vector<float> out(static_cast<size_t>(num_layers_ * T * H));
  for (int64_t i = 0; i < num_pages; ++i) {
    const PageId page = pages[static_cast<size_t>(i)];
    M3_CHECK(covers(page, i), "[draft_feature_store] page " + std::to_string(page) +
                                  " does not hold the features of positions " +
                                  std::to_string(i * P) + ".." + std::to_string((i + 1) * P - 1));
    const Entry& e = entries_[static_cast<size_t>(page)];
    for (int64_t l = 0; l < num_layers_; ++l) {
      std::copy_n(e.data.begin() + static_cast<std::ptrdiff_t>(l * P * H), P * H,
                  out.begin() + static_cast<std::ptrdiff_t>((l * T + i * P) * H));
    }
  }
  return out;
}

int32_t DraftFeatureStore::num_allocated() const {
  int32_t n = 0;
  for (const Entry& e : entries_) n += e.data.empty() ? 0 : 1;
  return n;
}

}  // namespace m3
