// A fake model for engine tests: "next-token logits = f(context)", with a real paged KV store.
// forward() writes each fed token (and its position) into the slot its block table names and
// computes logits from the context READ BACK through the block table, so a wrong block table, a
// wrongly shared or reused page, or a stale prefix-cache page changes the output (and is counted
// in corrupt_reads). The logits depend on nothing but the context: batch invariant by design,
// which lets tests check that the engine does not mix rows up.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <string>
#include <vector>

#include "model/model.h"
#include "sample/rng.h"
#include "sample/sampler.h"

namespace m3::testing {

class FakeModel : public ModelRunner {
 public:
  FakeModel(int32_t vocab, int32_t num_pages, int32_t page_size)
      : vocab_(vocab), num_pages_(num_pages), page_size_(page_size),
        kv_(static_cast<size_t>(num_pages) * page_size, Slot{}) {}

  int32_t vocab_size() const override { return vocab_; }
  int32_t num_kv_pages() const override { return num_pages_; }
  int32_t page_size() const override { return page_size_; }

  // Logits for a context, the definition the engine's output is checked against.
  static void logits_for(const std::vector<int32_t>& context, int32_t vocab, float* out) {
    uint64_t h = 0x12345;
    for (int32_t t : context) h = splitmix64(h ^ static_cast<uint64_t>(t));
    for (int32_t v = 0; v < vocab; ++v) {
      const uint64_t r = splitmix64(h + static_cast<uint64_t>(v) * 0x9E3779B97F4A7C15ull);
      out[v] = static_cast<float>(r >> 40) / static_cast<float>(1 << 24) * 8.0f - 4.0f;
    }
  }

  int32_t hidden_size() const override { return 8; }

  Status forward(const ModelStep& step, ModelOutput& out) override {
    ++num_calls;
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    if (fail_on_call == num_calls) return internal_error("[fake_model] injected failure");
    if (break_on_call > 0 && num_calls >= break_on_call) {
      return Status(StatusCode::kUnavailable, "[fake_model] rank 1 stopped answering");
    }
    out.logits.assign(step.slices.size(), {});
    out.tokens.clear();
    max_batch_seqs = std::max<int32_t>(max_batch_seqs, static_cast<int32_t>(step.slices.size()));
    for (size_t si = 0; si < step.slices.size(); ++si) {
      const ModelSlice& s = step.slices[si];
      const int32_t n = static_cast<int32_t>(s.tokens.size());
      for (int32_t i = 0; i < n; ++i) {
        const int32_t pos = static_cast<int32_t>(s.start_pos) + i;
        Slot& slot = slot_at(s.block_table, pos);
        slot = Slot{s.tokens[i], pos};
      }
      tokens_computed += n;
      for (int32_t r : s.logits_rows) {
        const int32_t end = static_cast<int32_t>(s.start_pos) + r + 1;
        std::vector<int32_t> context(end);
        for (int32_t pos = 0; pos < end; ++pos) {
          const Slot& slot = slot_at(s.block_table, pos);
          if (slot.pos != pos) ++corrupt_reads;
          context[pos] = slot.token;
        }
        std::vector<float>& dst = out.logits[si];
        const size_t row = dst.size();
        dst.resize(row + vocab_);
        logits_for(context, vocab_, dst.data() + row);
      }
      // Device sampling, as a GPU runner does it: the rows the engine offers are sampled here
      // with the CPU sampler on the same logits (so outputs must equal host sampling).
      if (!device_sampling || s.logits_rows.size() != 1) continue;
      if (out.tokens.empty()) out.tokens.assign(step.slices.size(), -1);
      if (!s.sample) {
        ++host_rows;
        continue;
      }
      const DeviceSampling& d = *s.sample;
      SamplingParams p;
      p.temperature = d.temperature;
      p.top_k = d.top_k;
      p.top_p = d.top_p;
      p.min_p = d.min_p;
      SampleInput in;
      in.logits = out.logits[si];
      in.params = &p;
      in.rng = d.rng;
      SamplerScratch scratch;
      out.tokens[si] = bad_device_token ? vocab_ : sample_token(in, &scratch).token;
      std::vector<float>().swap(out.logits[si]);  // no logits back (nor their memory)
      ++device_rows;
    }
    return Status::ok();
  }

  bool samples_on_device() const override { return device_sampling; }
  // HiCache: whole pages of slots to and from host memory.
  KvPageCopier* kv_page_copier() override { return &copier_; }
  // From break_on_call on, as a parallel group whose rank died: every step fails, and health()
  // says so.
  Status health() const override {
    if (break_on_call > 0 && num_calls >= break_on_call)
      return Status(StatusCode::kUnavailable, "rank 1 of 2 died (injected)");
    return Status::ok();
  }
  int64_t break_on_call = -1;

  bool device_sampling = false;   // samples_on_device()
  bool bad_device_token = false;  // return an out-of-vocabulary token for sampled rows
  int64_t device_rows = 0, host_rows = 0;  // rows sampled here / returned as logits

  int64_t num_calls = 0;
  int64_t fail_on_call = -1;
  int32_t sleep_ms = 0;  // per forward call, to make steps slow in threaded tests  // 1-based call index that returns an error
  int64_t corrupt_reads = 0;
  int64_t tokens_computed = 0;
  int32_t max_batch_seqs = 0;

 private:
  struct Slot {
    int32_t token = -1;
    int32_t pos = -1;
  };
  // Copies a page's slots as bytes; wait() has nothing to wait for.
  class SlotCopier final : public KvPageCopier {
   public:
    explicit SlotCopier(FakeModel* m) : m_(m) {}
    int64_t page_bytes() const override {
      return static_cast<int64_t>(sizeof(Slot)) * m_->page_size_;
    }
    std::unique_ptr<HostPageArena> allocate_host_arena(int64_t bytes) override {
      return std::make_unique<HeapPageArena>(bytes);
    }
    Status save(std::span<const PageCopy> copies) override {
      for (const PageCopy& c : copies) std::memcpy(c.host, page(c.device_page), page_bytes());
      return Status::ok();
    }
    Status load(std::span<const PageCopy> copies) override {
      for (const PageCopy& c : copies) std::memcpy(page(c.device_page), c.host, page_bytes());
      return Status::ok();
    }
    Status wait() override { return Status::ok(); }

   private:
    Slot* page(PageId p) const {
      M3_CHECK(p >= 0 && p < m_->num_pages_, "[fake_model] copy of a bad page id");
      return &m_->kv_[static_cast<size_t>(p) * m_->page_size_];
    }
    FakeModel* m_;
  };

  Slot& slot_at(std::span<const int32_t> bt, int32_t pos) {
    const size_t page_idx = static_cast<size_t>(pos / page_size_);
    M3_CHECK(page_idx < bt.size(), "[fake_model] position " + std::to_string(pos) +
                                       " beyond the block table (" + std::to_string(bt.size()) +
                                       " pages)");
    const int32_t page = bt[page_idx];
    M3_CHECK(page >= 0 && page < num_pages_, "[fake_model] bad page id");
    return kv_[static_cast<size_t>(page) * page_size_ + pos % page_size_];
  }

  int32_t vocab_;
  int32_t num_pages_;
  int32_t page_size_;
  std::vector<Slot> kv_;
  SlotCopier copier_{this};
};

}  // namespace m3::testing
