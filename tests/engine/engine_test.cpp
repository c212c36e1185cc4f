// Engine loop with the fake model: outputs against direct computation, stop conditions, usage,
// cancellation, errors, and the invariants (prefix hit == miss, batch invariance, preemption ==
// no preemption, seeded reproducibility, every page returned).
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "engine_test_util.h"

namespace m3 {
namespace {

using namespace m3::testing;

GenerateRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt_tokens = std::move(prompt);
  r.params.temperature = 0.0f;
  r.params.max_tokens = max_tokens;
  return r;
}

Outcome run_one(Engine& e, GenerateRequest r) {
  const int32_t n = r.params.n;
  auto h = e.submit(std::move(r));
  EXPECT_TRUE(h.is_ok()) << h.status().to_string();
  std::vector<RequestHandle> hs;
  hs.push_back(std::move(h).value());
  return run_all(e, hs, {n})[0];
}

TEST(Engine, GreedyOutputMatchesDirectComputation) {
  EngineFixtureConfig f;
  FakeModel* model;
  auto e = make_engine(f, &model);
  const std::vector<int32_t> prompt = prompt_of(1, 11, f.vocab);
  Outcome o = run_one(*e, greedy(prompt, 9));
  ASSERT_TRUE(o.done);
  EXPECT_EQ(o.tokens[0], greedy_reference(prompt, f.vocab, 9));
  EXPECT_EQ(o.finish[0], FinishReason::kLength);
  EXPECT_EQ(o.usage.prompt_tokens, 11);
  EXPECT_EQ(o.usage.completion_tokens, 9);
  EXPECT_EQ(o.usage.cached_tokens, 0);
  EXPECT_EQ(model->corrupt_reads, 0);
  // Prompt 11 in one chunk, then 8 decode steps (the 9th token is sampled, never fed).
  EXPECT_EQ(model->tokens_computed, 11 + 8);
  EngineStats s = e->stats();
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.num_requests_running + s.num_requests_waiting, 0);
  EXPECT_EQ(s.kv_pages_free + s.kv_pages_cached, s.kv_pages_total);
  EXPECT_EQ(s.generation_tokens_total, 9u);
}

TEST(Engine, EosAndStopTokenIdsStopAndIgnoreEosContinues) {
  EngineFixtureConfig f;
  const std::vector<int32_t> prompt = prompt_of(2, 7, f.vocab);
  const std::vector<int32_t> ref = greedy_reference(prompt, f.vocab, 12);
  // The first token equal to ref[4] stops generation.
  const int32_t stop_tok = ref[4];
  const size_t first = std::find(ref.begin(), ref.end(), stop_tok) - ref.begin();
  f.eos = {stop_tok};
  auto e = make_engine(f);
  Outcome o = run_one(*e, greedy(prompt, 12));
  EXPECT_EQ(o.finish[0], FinishReason::kStop);
  EXPECT_EQ(o.tokens[0], std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(o.usage.completion_tokens, static_cast<int32_t>(first + 1));

  GenerateRequest r = greedy(prompt, 12);
  r.params.ignore_eos = true;
  o = run_one(*e, r);
  EXPECT_EQ(o.finish[0], FinishReason::kLength);
  EXPECT_EQ(o.tokens[0], ref);

  f.eos = {};
  auto e2 = make_engine(f);
  r = greedy(prompt, 12);
  r.params.stop_token_ids = {stop_tok};
  o = run_one(*e2, r);
  EXPECT_EQ(o.finish[0], FinishReason::kStop);
  EXPECT_EQ(o.tokens[0].size(), first + 1);
}

TEST(Engine, StopStringAcrossTokensIsCutFromTheText) {
  EngineFixtureConfig f;
  f.detok = letter_detokenizer();
  auto e = make_engine(f);
  const std::vector<int32_t> prompt = prompt_of(3, 9, f.vocab);
  const std::vector<int32_t> ref = greedy_reference(prompt, f.vocab, 20);
  std::string full;
  for (int32_t t : ref) full += static_cast<char>('a' + t % 26);
  const std::string stop = full.substr(5, 3);  // spans three tokens
  const size_t at = full.find(stop);
  GenerateRequest r = greedy(prompt, 20);
  r.params.stop = {"zzzzzzzzzz", stop};
  Outcome o = run_one(*e, r);
  EXPECT_EQ(o.finish[0], FinishReason::kStop);
  EXPECT_EQ(o.stop_string[0], stop);
  EXPECT_EQ(o.text[0], full.substr(0, at));
  // Generation stopped at the token that completed the stop string.
  EXPECT_EQ(o.tokens[0].size(), at + stop.size());
  EXPECT_EQ(o.usage.completion_tokens, static_cast<int32_t>(at + stop.size()));

  // Without a match the held-back text is flushed at the end.
  r.params.stop = {"zzzzzzzzzz"};
  r.params.max_tokens = 6;
  o = run_one(*e, r);
  EXPECT_EQ(o.finish[0], FinishReason::kLength);
  EXPECT_EQ(o.text[0], full.substr(0, 6));
}

TEST(Engine, PrefixHitGivesTheSameOutputAsAMiss) {
  EngineFixtureConfig f;
  FakeModel* model;
  auto e = make_engine(f, &model);
  std::vector<int32_t> prompt = prompt_of(4, 23, f.vocab);
  GenerateRequest r;
  r.prompt_tokens = prompt;
  r.params.seed = 77;
  r.params.max_tokens = 10;
  r.params.temperature = 0.8f;
  Outcome miss = run_one(*e, r);
  EXPECT_EQ(miss.usage.cached_tokens, 0);
  const int64_t computed_before = model->tokens_computed;
  Outcome hit = run_one(*e, r);
  EXPECT_EQ(hit.tokens, miss.tokens);
  EXPECT_EQ(hit.usage.cached_tokens, 20);  // 5 full pages of 4; the last 3 tokens recomputed
  EXPECT_EQ(model->tokens_computed - computed_before, 3 + 9);
  EXPECT_EQ(e->stats().prefix_cache_hit_tokens_total, 20u);
  // Multi-turn: the next prompt extends the previous prompt + answer.
  std::vector<int32_t> turn2 = prompt;
  turn2.insert(turn2.end(), miss.tokens[0].begin(), miss.tokens[0].end());
  turn2.push_back(5);
  r.prompt_tokens = turn2;
  Outcome t2 = run_one(*e, r);
  EXPECT_EQ(t2.usage.cached_tokens, 32);  // prompt 23 + 9 computed answer tokens = 32
  f.prefix = false;
  auto cold = make_engine(f);
  EXPECT_EQ(run_one(*cold, r).tokens, t2.tokens);
  EXPECT_EQ(model->corrupt_reads, 0);
}

TEST(Engine, OutputDoesNotDependOnBatchOrPreemption) {
  // Reference: each request alone on a roomy engine. Then all together on a roomy engine, and
  // all together on a pool so small that sequences are preempted and recomputed.
  EngineFixtureConfig roomy;
  roomy.pages = 256;
  std::mt19937 rng(11);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    GenerateRequest r;
    r.prompt_tokens = prompt_of(i % 4, 3 + rng() % 20, roomy.vocab);  // shared prefixes
    r.params.max_tokens = 1 + rng() % 15;
    r.params.temperature = (i % 3 == 0) ? 0.0f : 0.7f;
    r.params.top_p = 0.9f;
    r.params.seed = 1000 + i;
    r.params.n = (i % 5 == 0) ? 3 : 1;
    r.params.presence_penalty = (i % 2) ? 0.5f : 0.0f;
    reqs.push_back(r);
  }
  std::vector<Outcome> alone;
  for (const auto& r : reqs) {
    auto e = make_engine(roomy);
    alone.push_back(run_one(*e, r));
  }
  for (int32_t pages : {256, 12}) {
    EngineFixtureConfig f = roomy;
    f.pages = pages;
    f.budget = 8;
    f.sampler_threads = pages == 256 ? 3 : 1;  // parallel sampling changes nothing
    FakeModel* model;
    auto e = make_engine(f, &model);
    std::vector<RequestHandle> hs;
    std::vector<int32_t> ns;
    for (const auto& r : reqs) {
      auto h = e->submit(r);
      ASSERT_TRUE(h.is_ok()) << h.status().to_string();
      hs.push_back(std::move(h).value());
      ns.push_back(r.params.n);
    }
    std::vector<Outcome> together = run_all(*e, hs, ns);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(together[i].done) << "pages " << pages << " request " << i;
      EXPECT_EQ(together[i].tokens, alone[i].tokens) << "pages " << pages << " request " << i;
    }
    EXPECT_EQ(model->corrupt_reads, 0);
    EXPECT_GT(model->max_batch_seqs, 1);
    const EngineStats s = e->stats();
    if (pages == 12) {
      EXPECT_GT(s.num_preemptions_total, 0u);
    }
    EXPECT_EQ(s.kv_pages_used, 0);
    EXPECT_EQ(s.kv_pages_free + s.kv_pages_cached, pages);
  }
}

TEST(Engine, SeededSamplingIsReproducibleAndNSequencesDiffer) {
  EngineFixtureConfig f;
  auto e = make_engine(f);
  GenerateRequest r;
  r.prompt_tokens = prompt_of(5, 10, f.vocab);
  r.params.seed = 4242;
  r.params.n = 4;
  r.params.max_tokens = 12;
  Outcome a = run_one(*e, r);
  Outcome b = run_one(*make_engine(f), r);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.usage.completion_tokens, 48);
  EXPECT_EQ(a.usage.prompt_tokens, 10);
  EXPECT_NE(a.tokens[0], a.tokens[1]);
  r.params.seed = 4243;
  EXPECT_NE(run_one(*e, r).tokens, a.tokens);
}

TEST(Engine, LogprobsReportedWhenAsked) {
  EngineFixtureConfig f;
  auto e = make_engine(f);
  GenerateRequest r = greedy(prompt_of(6, 5, f.vocab), 3);
  r.params.logprobs = true;
  r.params.top_logprobs = 2;
  Outcome o = run_one(*e, r);
  ASSERT_EQ(o.detail[0].size(), 3u);
  for (const auto& g : o.detail[0]) {
    ASSERT_EQ(g.top_logprobs.size(), 2u);
    EXPECT_EQ(g.top_logprobs[0].token, g.token);  // greedy: the sampled token is the top one
    EXPECT_FLOAT_EQ(g.top_logprobs[0].logprob, g.logprob);
    EXPECT_LT(g.logprob, 0.0f);
  }
}

TEST(Engine, CancelFreesPagesWithinAStep) {
  EngineFixtureConfig f;
  auto e = make_engine(f);
  auto h = e->submit(greedy(prompt_of(7, 30, f.vocab), 200));
  ASSERT_TRUE(h.is_ok());
  for (int i = 0; i < 4; ++i) e->step();
  EXPECT_GT(e->stats().kv_pages_used, 0);
  EXPECT_EQ(e->stats().num_requests_running, 1);
  e->cancel(h->id());
  e->step();  // the next step frees it
  EngineStats s = e->stats();
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.num_requests_running, 0);
  Outcome o;
  drain_events(*h, &o, 1);
  EXPECT_TRUE(o.done);
  EXPECT_EQ(o.finish[0], FinishReason::kCancelled);
  EXPECT_STREQ(finish_reason_name(o.finish[0]), "abort");
}

TEST(Engine, DroppingTheHandleCancelsTheRequest) {
  EngineFixtureConfig f;
  auto e = make_engine(f);
  {
    auto h = e->submit(greedy(prompt_of(8, 20, f.vocab), 200));
    ASSERT_TRUE(h.is_ok());
    e->step();
    EXPECT_GT(e->stats().kv_pages_used, 0);
  }  // client gone
  e->step();
  EXPECT_EQ(e->stats().kv_pages_used, 0);
  EXPECT_FALSE(e->step());  // idle
  // Cancelling a request still in the inbox works too.
  auto h2 = e->submit(greedy(prompt_of(8, 20, f.vocab), 10));
  h2->cancel();
  e->step();
  Outcome o;
  drain_events(*h2, &o, 1);
  EXPECT_TRUE(o.done);
  EXPECT_EQ(o.finish[0], FinishReason::kCancelled);
}

TEST(Engine, SubmitErrors) {
  EngineFixtureConfig f;
  f.context_length = 40;
  f.max_waiting = 2;
  f.pages = 16;  // 64 tokens
  auto e = make_engine(f);
  auto r = e->submit(greedy(prompt_of(9, 30, f.vocab), 20));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("30 tokens"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("max_tokens (20)"), std::string::npos);
  EXPECT_NE(r.status().message().find("40"), std::string::npos);
  EXPECT_EQ(e->submit(greedy({}, 3)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->submit(greedy({f.vocab}, 3)).status().code(), StatusCode::kInvalidArgument);
  GenerateRequest stop = greedy({1}, 3);
  stop.params.stop = {"x"};  // no detokenizer
  EXPECT_EQ(e->submit(stop).status().code(), StatusCode::kInvalidArgument);
  GenerateRequest bad = greedy({1}, 3);
  bad.params.top_p = 2;
  EXPECT_NE(e->submit(bad).status().message().find("top_p"), std::string::npos);

  // Queue full: 2 waiting requests allowed.
  auto a = e->submit(greedy({1, 2}, 3));
  auto b = e->submit(greedy({1, 2}, 3));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto c = e->submit(greedy({1, 2}, 3));
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("queue is full"), std::string::npos);
  // Unset max_tokens defaults to the rest of the context.
  e->step();
  e->step();
  auto d = e->submit(greedy({1, 2}, -1));
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  std::vector<RequestHandle> hs;
  hs.push_back(std::move(d).value());
  Outcome o = run_all(*e, hs, {1})[0];
  EXPECT_EQ(o.usage.completion_tokens, 38);
  EXPECT_EQ(o.finish[0], FinishReason::kLength);
}

TEST(Engine, ModelErrorFailsTheStepsRequestsOnly) {
  EngineFixtureConfig f;
  FakeModel* model;
  auto e = make_engine(f, &model);
  model->fail_on_call = 2;
  Outcome o = run_one(*e, greedy(prompt_of(10, 6, f.vocab), 5));
  EXPECT_TRUE(o.done);
  EXPECT_EQ(o.finish[0], FinishReason::kError);
  EXPECT_FALSE(o.error.is_ok());
  EXPECT_NE(o.error.message().find("injected"), std::string::npos);
  EXPECT_EQ(e->stats().kv_pages_used, 0);
  // The engine keeps serving.
  Outcome ok = run_one(*e, greedy(prompt_of(10, 6, f.vocab), 5));
  EXPECT_EQ(ok.finish[0], FinishReason::kLength);
  EXPECT_EQ(ok.tokens[0], greedy_reference(prompt_of(10, 6, f.vocab), f.vocab, 5));
}

TEST(Engine, BrokenRunnerFailsEverythingAndRefusesNewRequests) {
  EngineFixtureConfig f;
  int failures = 0;
  std::string why;
  f.on_failure = [&](const Status& s) {
    ++failures;
    why = s.message();
  };
  FakeModel* model;
  auto e = make_engine(f, &model);
  model->break_on_call = 3;
  auto a = e->submit(greedy(prompt_of(1, 6, f.vocab), 20));
  auto b = e->submit(greedy(prompt_of(2, 6, f.vocab), 20));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  std::vector<RequestHandle> hs;
  hs.push_back(std::move(a).value());
  hs.push_back(std::move(b).value());
  std::vector<Outcome> out = run_all(*e, hs, {1, 1});
  for (const Outcome& o : out) {
    EXPECT_TRUE(o.done);
    EXPECT_EQ(o.finish[0], FinishReason::kError);
    EXPECT_EQ(o.error.code(), StatusCode::kUnavailable) << o.error.to_string();
    EXPECT_NE(o.error.message().find("rank 1"), std::string::npos) << o.error.to_string();
  }
  EXPECT_EQ(failures, 1);
  EXPECT_NE(why.find("rank 1 of 2 died"), std::string::npos) << why;
  EXPECT_EQ(e->failure().code(), StatusCode::kUnavailable);
  EXPECT_EQ(e->stats().kv_pages_used, 0);
  // New requests are refused with the failure; the runner is not stepped again.
  const int64_t calls = model->num_calls;
  auto c = e->submit(greedy(prompt_of(3, 6, f.vocab), 5));
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  e->step();
  EXPECT_EQ(model->num_calls, calls);
  EXPECT_EQ(failures, 1);
}

TEST(Engine, SamplingFailureFailsOnlyItsRequest) {
  EngineFixtureConfig f;
  auto e = make_engine(f);
  GenerateRequest bad = greedy(prompt_of(12, 5, f.vocab), 5);
  bad.params.min_tokens = 2;
  for (int32_t t = 0; t < f.vocab; ++t) bad.params.stop_token_ids.push_back(t);  // all masked
  GenerateRequest good = greedy(prompt_of(13, 5, f.vocab), 5);
  std::vector<RequestHandle> hs;
  hs.push_back(std::move(e->submit(bad)).value());
  hs.push_back(std::move(e->submit(good)).value());
  std::vector<Outcome> o = run_all(*e, hs, {1, 1});
  EXPECT_EQ(o[0].finish[0], FinishReason::kError);
  EXPECT_NE(o[0].error.message().find("-inf"), std::string::npos) << o[0].error.to_string();
  EXPECT_EQ(o[1].finish[0], FinishReason::kLength);
  EXPECT_EQ(o[1].tokens[0], greedy_reference(prompt_of(13, 5, f.vocab), f.vocab, 5));
  EXPECT_EQ(e->stats().kv_pages_used, 0);
}

TEST(Engine, StatsCountRunningAndWaitingRequests) {
  EngineFixtureConfig f;
  f.max_running = 2;
  auto e = make_engine(f);
  std::vector<RequestHandle> hs;
  for (int i = 0; i < 5; ++i) hs.push_back(std::move(e->submit(greedy({1, 2, 3}, 50))).value());
  EXPECT_EQ(e->stats().num_requests_waiting, 5);  // still in the inbox
  e->step();
  EngineStats s = e->stats();
  EXPECT_EQ(s.num_requests_running, 2);
  EXPECT_EQ(s.num_requests_waiting, 3);
  EXPECT_EQ(s.kv_pages_used, 2);
  EXPECT_EQ(s.kv_pages_total, f.pages);
}

// The queue bound holds at every instant, not only between steps: a request the loop has taken
// from the inbox but not yet counted (the whole step after it is picked up) is still waiting.
// Seen end to end as a 200 where a 429 was due when steps are slow (a loaded CPU).
TEST(Engine, QueueFullHoldsWhileTheLoopAdmits) {
  EngineFixtureConfig f;
  f.max_running = 1;
  f.max_waiting = 1;
  FakeModel* model = nullptr;
  auto e = make_engine(f, &model);
  model->sleep_ms = 20;  // slow steps: the window is a whole step wide
  e->start();
  auto a = e->submit(greedy({1, 2}, 200));
  ASSERT_TRUE(a.is_ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (e->stats().num_requests_running != 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(e->stats().num_requests_running, 1);
  auto b = e->submit(greedy({3, 4}, 40));  // waits: one running at most
  ASSERT_TRUE(b.is_ok());
  std::vector<RequestHandle> accepted;
  int32_t seen_waiting_zero = 0;
  // Several steps' worth of tries: B is picked up by the loop within the first.
  for (int i = 0; i < 150; ++i) {
    auto c = e->submit(greedy({5, 6}, 2));
    if (c.is_ok()) {
      accepted.push_back(std::move(c).value());
    } else {
      EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
    }
    if (e->stats().num_requests_waiting != 1) ++seen_waiting_zero;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(accepted.empty()) << accepted.size() << " submissions got past a full queue";
  EXPECT_EQ(seen_waiting_zero, 0) << "num_requests_waiting missed the waiting request";
  e->drain(std::chrono::milliseconds(0));
}

TEST(Engine, ThreadedServingAndDrain) {
  EngineFixtureConfig f;
  f.pages = 32;
  auto e = make_engine(f);
  e->start();
  std::vector<std::thread> clients;
  std::vector<std::vector<int32_t>> got(8);
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      auto h = e->submit(greedy(prompt_of(i, 5 + i, f.vocab), 6));
      ASSERT_TRUE(h.is_ok());
      for (;;) {
        auto ev = h->stream().next(std::chrono::milliseconds(5000));
        ASSERT_TRUE(ev.has_value()) << "timed out";
        for (const auto& d : ev->seqs) {
          for (const auto& g : d.tokens) got[i].push_back(g.token);
        }
        if (ev->done) break;
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(got[i], greedy_reference(prompt_of(i, 5 + i, f.vocab), f.vocab, 6)) << i;
  }
  // Drain with time to spare: everything admitted finishes.
  auto h = e->submit(greedy(prompt_of(1, 5, f.vocab), 20));
  ASSERT_TRUE(h.is_ok());
  EXPECT_TRUE(e->drain(std::chrono::milliseconds(5000)));
  EXPECT_TRUE(e->is_draining());
  EXPECT_EQ(e->submit(greedy({1}, 1)).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(e->stats().kv_pages_used, 0);
  Outcome o;
  drain_events(*h, &o, 1);
  EXPECT_EQ(o.finish[0], FinishReason::kLength);
  EXPECT_EQ(o.tokens[0].size(), 20u);
}

TEST(Engine, DrainDeadlineCancelsWhatIsLeft) {
  EngineFixtureConfig f;
  FakeModel* model;
  auto e = make_engine(f, &model);
  model->sleep_ms = 2;  // 100 tokens take >= 200 ms
  e->start();
  auto h = e->submit(greedy(prompt_of(1, 5, f.vocab), 100));
  ASSERT_TRUE(h.is_ok());
  EXPECT_FALSE(e->drain(std::chrono::milliseconds(30)));
  Outcome o;
  drain_events(*h, &o, 1);
  EXPECT_TRUE(o.done);
  EXPECT_EQ(o.finish[0], FinishReason::kCancelled);
  EXPECT_LT(o.tokens[0].size(), 100u);
  EXPECT_EQ(e->stats().kv_pages_used, 0);
}

}  // namespace
}  // namespace m3

namespace m3::testing {
namespace {

// Every prompt position's logits in the first event: computed in full (no prefix-cache match),
// in chunks, with device sampling on. With 16 tokens the last chunk has one token: a runner that
// samples a one-row slice itself returns no logits for it, so the engine must not offer it.
TEST(Engine, PromptLogitsCoverEveryPromptPosition) {
  for (int32_t prompt_len : {17, 16}) {
    SCOPED_TRACE("prompt of " + std::to_string(prompt_len));
    EngineFixtureConfig f;
    f.budget = 5;  // prefill in chunks of 5
    FakeModel* model;
    auto e = make_engine(f, &model);
    model->device_sampling = true;
    const std::vector<int32_t> prompt = prompt_of(9, prompt_len, f.vocab);
    // Warm the prefix cache with the same prompt: the scored request must not use it.
    Outcome warm = run_one(*e, greedy(prompt, 2));
    ASSERT_TRUE(warm.done);
    GenerateRequest r = greedy(prompt, 3);
    r.prompt_logits = true;
    const int64_t computed_before = model->tokens_computed;
    auto h = e->submit(r);
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    std::vector<float> logits;
    std::vector<int32_t> tokens;
    for (int i = 0; i < 1000 && !h->stream().done(); ++i) e->step();
    int events_with_logits = 0;
    while (auto ev = h->stream().try_next()) {
      EXPECT_TRUE(ev->error.is_ok()) << ev->error.to_string();
      if (!ev->prompt_logits.empty()) {
        ++events_with_logits;
        logits = ev->prompt_logits;
        EXPECT_FALSE(ev->seqs.empty() || ev->seqs[0].tokens.empty()) << "with the first token";
      }
      for (const SeqDelta& d : ev->seqs)
        for (const GeneratedToken& g : d.tokens) tokens.push_back(g.token);
    }
    EXPECT_EQ(events_with_logits, 1);
    ASSERT_EQ(logits.size(), prompt.size() * f.vocab);
    std::vector<float> want(f.vocab);
    for (size_t p = 0; p < prompt.size(); ++p) {
      FakeModel::logits_for(std::vector<int32_t>(prompt.begin(), prompt.begin() + p + 1), f.vocab,
                            want.data());
      for (int32_t v = 0; v < f.vocab; ++v) ASSERT_EQ(logits[p * f.vocab + v], want[v]) << p;
    }
    EXPECT_EQ(tokens, greedy_reference(prompt, f.vocab, 3));
    EXPECT_EQ(model->tokens_computed - computed_before, prompt_len + 2);  // the prompt, 2 decodes
    EXPECT_EQ(model->corrupt_reads, 0);
    // n > 1 cannot return one set of prompt logits.
    r.params.n = 2;
    EXPECT_EQ(e->submit(r).status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace m3::testing
