// The seam between the engine and a model: execute one StepPlan over the paged KV cache and return
// logits for the sequences that need them. CPU adapter: cpu_model_runner.h (when the CPU model's
// batch forward lands); tests use a fake model.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "sample/device_sampling.h"
#include "sched/step_plan.h"

namespace m3 {

struct LogitsOut {
  int32_t vocab_size = 0;
  // [num_rows, vocab_size] float32, one row per slice with need_logits, in plan order: the logits
  // after the LAST token of that slice; without the rows the runner sampled itself (tokens).
  std::vector<float> data;
  // Empty, or one entry per slice with need_logits (plan order): the token the runner sampled
  // for that row (forward_sampling), or -1 where the row's logits are in `data`.
  std::vector<int32_t> tokens;

  // Rows held in `data`.
  int32_t num_rows() const {
    return vocab_size > 0 ? static_cast<int32_t>(data.size() / vocab_size) : 0;
  }
  std::span<const float> row(int32_t i) const {
    return {data.data() + static_cast<size_t>(i) * vocab_size, static_cast<size_t>(vocab_size)};
  }
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int32_t vocab_size() const = 0;
  // KV pages the runner holds memory for (page ids 0 .. num_kv_pages() - 1), each page_size()
  // tokens of K, V and indexer keys for every layer.
  virtual int32_t num_kv_pages() const = 0;
  virtual int32_t page_size() const = 0;

  // Executes `plan`: for every slice, writes the K/V (and index keys) of its tokens at positions
  // [start_pos, end_pos) into the slice's pages and attends over [0, end_pos) through its block
  // table; fills `out` with plan.num_logits() rows. Slices are independent sequences: a row must
  // not depend on the other slices (batch invariance; exact on the CPU backend).
  // Called only from the engine thread. A non-ok Status (or an m3::InternalError) fails the
  // step's requests, not the process.
  virtual Status forward(const StepPlan& plan, LogitsOut& out) = 0;

  // Whether forward_sampling() may sample rows itself (on its device, next to the logits).
  virtual bool samples_on_device() const { return false; }
  // forward(), where `sampling` (empty, or one entry per slice with need_logits, plan order)
  // names the rows the runner may sample itself (device_sampling.h) instead of returning their
  // logits; it reports which it did in out.tokens. The default samples none.
  virtual Status forward_sampling(const StepPlan& plan,
                                  std::span<const std::optional<DeviceSampling>> sampling,
                                  LogitsOut& out) {
    (void)sampling;
    return forward(plan, out);
  }
};

}  // namespace m3
