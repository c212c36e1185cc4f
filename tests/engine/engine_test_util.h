#pragma once

#include <functional>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fake_model.h"

namespace m3::testing {

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per sequence
  std::vector<std::string> text;
  std::vector<FinishReason> finish;
  std::vector<std::string> stop_string;
  std::vector<std::vector<GeneratedToken>> detail;
  Usage usage;
  Status error;
  int num_events = 0;
  bool done = false;
};

// Reads every queued event of a handle into an Outcome.
inline void drain_events(RequestHandle& h, Outcome* o, int32_t n) {
  o->tokens.resize(n);
  o->text.resize(n);
  o->finish.resize(n, FinishReason::kError);
  o->stop_string.resize(n);
  o->detail.resize(n);
  while (auto e = h.stream().try_next()) {
    ++o->num_events;
    EXPECT_FALSE(o->done) << "event after done";
    for (const SeqDelta& d : e->seqs) {
      for (const GeneratedToken& g : d.tokens) {
        o->tokens[d.seq_index].push_back(g.token);
        o->detail[d.seq_index].push_back(g);
      }
      o->text[d.seq_index] += d.text;
      if (d.finish_reason) {
        o->finish[d.seq_index] = *d.finish_reason;
        o->stop_string[d.seq_index] = d.stop_string;
      }
    }
    o->usage = e->usage;
    if (!e->error.is_ok()) o->error = e->error;
    o->done = o->done || e->done;
  }
}

// Steps a synchronous engine until every handle is done (bounded), then collects.
inline std::vector<Outcome> run_all(Engine& engine, std::vector<RequestHandle>& handles,
                                    const std::vector<int32_t>& ns, int max_steps = 10000) {
  std::vector<Outcome> out(handles.size());
  for (int step = 0; step < max_steps; ++step) {
    bool all_done = true;
    for (auto& h : handles) all_done = all_done && h.stream().done();
    if (all_done) break;
    engine.step();
  }
  for (size_t i = 0; i < handles.size(); ++i) drain_events(handles[i], &out[i], ns[i]);
  return out;
}

struct EngineFixtureConfig {
  int32_t vocab = 50;
  int32_t pages = 64;
  int32_t page_size = 4;
  int32_t budget = 16;
  int32_t max_running = 16;
  bool prefix = true;
  int32_t context_length = 0;
  int32_t max_waiting = 4096;
  std::vector<int32_t> eos;
  DetokenizerFactory detok;
  int32_t sampler_threads = 1;
  std::function<void(const Status&)> on_failure;
};

inline std::unique_ptr<Engine> make_engine(const EngineFixtureConfig& f,
                                           FakeModel** model_out = nullptr) {
  auto model = std::make_unique<FakeModel>(f.vocab, f.pages, f.page_size);
  if (model_out) *model_out = model.get();
  EngineConfig c;
  c.scheduler.num_pages = 0;
  c.scheduler.page_size = f.page_size;
  c.scheduler.chunked_prefill_size = f.budget;
  c.scheduler.max_running_requests = f.max_running;
  c.scheduler.enable_prefix_cache = f.prefix;
  c.context_length = f.context_length;
  c.max_waiting_requests = f.max_waiting;
  c.generation_defaults.eos_token_ids = f.eos;
  c.detokenizer = f.detok;
  c.num_sampler_threads = f.sampler_threads;
  c.on_failure = f.on_failure;
  auto e = Engine::create(std::move(c), std::move(model));
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  return std::move(e).value();
}

// Greedy continuation by direct computation from FakeModel::logits_for.
inline std::vector<int32_t> greedy_reference(std::vector<int32_t> context, int32_t vocab,
                                             int32_t n) {
  std::vector<int32_t> out;
  std::vector<float> logits(vocab);
  for (int32_t i = 0; i < n; ++i) {
    FakeModel::logits_for(context, vocab, logits.data());
    int32_t best = 0;
    for (int32_t v = 1; v < vocab; ++v) {
      if (logits[v] > logits[best]) best = v;
    }
    out.push_back(best);
    context.push_back(best);
  }
  return out;
}

inline std::vector<int32_t> prompt_of(int32_t seed, int32_t len, int32_t vocab) {
  std::vector<int32_t> p(len);
  for (int32_t i = 0; i < len; ++i) p[i] = static_cast<int32_t>((seed * 31 + i * 7) % vocab);
  return p;
}

// Detokenizer for tests: token t -> one lowercase letter ('a' + t % 26).
class LetterDetokenizer : public TextDetokenizer {
 public:
  std::string push(int32_t token) override { return std::string(1, 'a' + token % 26); }
};
inline DetokenizerFactory letter_detokenizer() {
  return [](const GenerateRequest&) { return std::make_unique<LetterDetokenizer>(); };
}

}  // namespace m3::testing
