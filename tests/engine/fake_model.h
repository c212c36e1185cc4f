// A fake model for engine tests: "next-token logits = f(context)", with a real paged KV store.
// forward() writes each fed token (and its position) into the slot its block table names and
// computes logits from the context READ BACK through the block table, so a wrong block table, a
// wrongly shared or reused page, or a stale prefix-cache page changes the output (and is counted
// in corrupt_reads). The logits depend on nothing but the context: batch invariant by design,
// which lets tests check that the engine does not mix rows up.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>
#include <string>
#include <vector>

#include "engine/model_runner.h"
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

  Status forward(const StepPlan& plan, LogitsOut& out) override {
    ++num_calls;
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    if (fail_on_call == num_calls) return internal_error("[fake_model] injected failure");
    out.vocab_size = vocab_;
    out.data.clear();
    max_batch_seqs = std::max<int32_t>(max_batch_seqs, static_cast<int32_t>(plan.seqs.size()));
    for (const SeqSlice& s : plan.seqs) {
      for (int32_t i = 0; i < s.num_tokens(); ++i) {
        const int32_t pos = s.start_pos + i;
        Slot& slot = slot_at(s.block_table, pos);
        slot = Slot{s.token_ids[i], pos};
      }
      tokens_computed += s.num_tokens();
      if (!s.need_logits) continue;
      std::vector<int32_t> context(s.end_pos());
      for (int32_t pos = 0; pos < s.end_pos(); ++pos) {
        const Slot& slot = slot_at(s.block_table, pos);
        if (slot.pos != pos) ++corrupt_reads;
        context[pos] = slot.token;
      }
      const size_t row = out.data.size();
      out.data.resize(row + vocab_);
      logits_for(context, vocab_, out.data.data() + row);
    }
    return Status::ok();
  }

  // Device sampling, as a GPU runner does it: the rows the engine offers are sampled here with
  // the CPU sampler on the same logits (so outputs must equal host sampling) and leave out.data.
  bool samples_on_device() const override { return device_sampling; }
  Status forward_sampling(const StepPlan& plan,
                          std::span<const std::optional<DeviceSampling>> sampling,
                          LogitsOut& out) override {
    M3_RETURN_IF_ERROR(forward(plan, out));
    if (!device_sampling) return Status::ok();
    const int32_t rows = out.num_rows();
    std::vector<float> kept;
    out.tokens.assign(static_cast<size_t>(rows), -1);
    for (int32_t r = 0; r < rows; ++r) {
      if (static_cast<size_t>(r) < sampling.size() && sampling[r].has_value()) {
        const DeviceSampling& d = *sampling[r];
        SamplingParams p;
        p.temperature = d.temperature;
        p.top_k = d.top_k;
        p.top_p = d.top_p;
        p.min_p = d.min_p;
        SampleInput in;
        in.logits = out.row(r);
        in.params = &p;
        in.rng = d.rng;
        SamplerScratch scratch;
        out.tokens[r] = bad_device_token ? vocab_ : sample_token(in, &scratch).token;
        ++device_rows;
      } else {
        kept.insert(kept.end(), out.row(r).begin(), out.row(r).end());
        ++host_rows;
      }
    }
    out.data = std::move(kept);
    return Status::ok();
  }

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
  Slot& slot_at(const BlockTable& bt, int32_t pos) {
    const size_t page_idx = static_cast<size_t>(pos / page_size_);
    M3_CHECK(page_idx < bt.size(), "[fake_model] position " + std::to_string(pos) +
                                       " beyond the block table (" + std::to_string(bt.size()) +
                                       " pages)");
    const PageId page = bt[page_idx];
    M3_CHECK(page >= 0 && page < num_pages_, "[fake_model] bad page id");
    return kv_[static_cast<size_t>(page) * page_size_ + pos % page_size_];
  }

  int32_t vocab_;
  int32_t num_pages_;
  int32_t page_size_;
  std::vector<Slot> kv_;
};

}  // namespace m3::testing
