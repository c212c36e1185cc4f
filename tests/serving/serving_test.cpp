// The serving adapters on the bundled m3-tiny: a chat request rendered by TemplateRenderer and
// tokenized by TokenizerCodec equals transformers' prompt ids (tests/fixtures/m3_tiny/golden.json),
// greedy generation through EngineBackend equals transformers' output ids and text, cancel frees
// the KV pages, the prefix cache reports cached tokens, and unset sampling options take the
// generation_config.json defaults.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/request.h"
#include "serving/engine_detokenizer.h"
#include "app/engine_stack.h"

namespace m3::serving {
namespace {

using app::EngineStackOptions;
using app::make_engine_stack;
using app::EngineStack;

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const fs::path kModel = fs::path(M3_REPO_ROOT) / "models" / "m3-tiny";
const fs::path kGolden = fs::path(M3_REPO_ROOT) / "tests" / "fixtures" / "m3_tiny" / "golden.json";

const json& golden() {
  static const json g = [] {
    std::ifstream in(kGolden);
    return json::parse(in);
  }();
  return g;
}

const json& golden_case(const std::string& name) {
  for (const auto& c : golden()["cases"])
    if (c["name"] == name) return c;
  throw std::runtime_error("no golden case " + name);
}

// Collects a request's events (the callback runs on the engine thread).
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<server::BackendEvent> events;
  bool done = false;

  server::EventCallback callback() {
    return [this](server::BackendEvent e) {
      std::lock_guard<std::mutex> lock(mu);
      done = done || e.done;
      events.push_back(std::move(e));
      cv.notify_all();
    };
  }
  bool wait_done(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return done; });
  }
  bool wait_events(size_t n, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return events.size() >= n || done; });
  }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<int32_t> out;
    for (const auto& e : events) out.insert(out.end(), e.tokens.begin(), e.tokens.end());
    return out;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu);
    std::string out;
    for (const auto& e : events) out += e.text;
    return out;
  }
};

class ServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineStackOptions o;
    o.num_threads = 2;
    o.kv_cache_bytes = int64_t{64} << 20;
    auto s = make_engine_stack(kModel.string(), o);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    stack_ = new EngineStack(std::move(s).value());
  }
  static void TearDownTestSuite() {
    delete stack_;
    stack_ = nullptr;
  }
  static EngineStack* stack_;
};
EngineStack* ServingTest::stack_ = nullptr;

std::vector<int32_t> ids_of(const json& j) {
  return j.get<std::vector<int32_t>>();
}

TEST_F(ServingTest, RenderedAndTokenizedChatEqualsGoldenPromptIds) {
  // Every case, tools included: requests are nlohmann::ordered_json end to end, so tool schemas
  // render (tojson) in the client's key order, as transformers renders them.
  int checked = 0, with_tools = 0;
  for (const auto& c : golden()["cases"]) {
    if (!c["tools"].is_null()) ++with_tools;
    const json kwargs = c["chat_template_kwargs"];
    auto text = stack_->renderer->render(c["messages"], c["tools"], kwargs, true);
    ASSERT_TRUE(text.is_ok()) << c["name"] << ": " << text.status().to_string();
    EXPECT_EQ(*text, c["prompt_text"].get<std::string>()) << c["name"];
    auto ids = stack_->codec->encode(*text);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(*ids, ids_of(c["prompt_ids"])) << c["name"];
    ++checked;
  }
  EXPECT_GE(checked, 9);
  EXPECT_GE(with_tools, 3);
}

TEST_F(ServingTest, CodecSpecialTokensAndRoundTrip) {
  // The template writes BOS; encode must not add another one.
  const auto& c = golden_case("chitchat_hello");
  auto ids = stack_->codec->encode(c["prompt_text"].get<std::string>());
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(ids->front(), 4066);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 4066), 1);
  auto think_close = stack_->codec->token_id("</mm:think>");
  ASSERT_TRUE(think_close.has_value());
  auto one = stack_->codec->encode("</mm:think>");
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(*one, std::vector<int32_t>{*think_close});
  auto kept = stack_->codec->decode(ids_of(c["prompt_ids"]), false);
  ASSERT_TRUE(kept.is_ok());
  EXPECT_EQ(*kept, c["prompt_text"].get<std::string>());
  // The think and tool markers are added but not special tokens (kept either way); BOS is special.
  auto kept_bos = stack_->codec->decode({4066, *think_close}, false);
  ASSERT_TRUE(kept_bos.is_ok());
  EXPECT_EQ(*kept_bos, "]~!b[</mm:think>");
  auto skipped = stack_->codec->decode({4066, *think_close}, true);
  ASSERT_TRUE(skipped.is_ok());
  EXPECT_EQ(*skipped, "</mm:think>");
  EXPECT_GE(stack_->codec->vocab_size(), 4096);
}

TEST_F(ServingTest, GreedyGenerationEqualsGoldenOutput) {
  const int32_t eos = golden()["eos_token_id"].get<int32_t>();
  for (const char* name :
       {"arith_add_adaptive", "arith_sub_disabled", "chitchat_hello", "tool_weather_adaptive"}) {
    const auto& c = golden_case(name);
    server::BackendRequest r;
    r.request_id = name;
    r.prompt_tokens = ids_of(c["prompt_ids"]);
    r.sampling.temperature = 0.0;
    r.sampling.max_tokens = golden()["max_new_tokens"].get<int32_t>();
    r.skip_special_tokens = false;
    Collector col;
    auto id = stack_->backend->submit(r, col.callback());
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    ASSERT_TRUE(col.wait_done()) << name;
    const auto want = ids_of(c["output_ids"]);
    EXPECT_EQ(col.tokens(), want) << name;
    // Text: the output without the final EOS (which adds no text), special markers kept.
    std::vector<int32_t> text_ids = want;
    if (!text_ids.empty() && text_ids.back() == eos) text_ids.pop_back();
    auto want_text = stack_->codec->decode(text_ids, false);
    ASSERT_TRUE(want_text.is_ok());
    EXPECT_EQ(col.text(), *want_text) << name;
    const auto& last = col.events.back();
    EXPECT_TRUE(last.done);
    EXPECT_EQ(last.finish_reason, c["stopped_at_eos"].get<bool>() ? "stop" : "length") << name;
    EXPECT_TRUE(last.error.empty()) << last.error;
  }
}

TEST_F(ServingTest, SkipSpecialTokensIsPassedToTheDetokenizer) {
  // chitchat_hello's 11th greedy token is EOS; with ignore_eos it is an ordinary token whose text
  // ("[e~[", a special token) shows only when special tokens are kept.
  const auto& c = golden_case("chitchat_hello");
  const auto want = ids_of(c["output_ids"]);
  ASSERT_EQ(want.back(), golden()["eos_token_id"].get<int32_t>());
  std::string texts[2];
  for (int skip = 0; skip < 2; ++skip) {
    server::BackendRequest r;
    r.prompt_tokens = ids_of(c["prompt_ids"]);
    r.sampling.temperature = 0.0;
    r.sampling.max_tokens = static_cast<int32_t>(want.size());
    r.sampling.ignore_eos = true;
    r.skip_special_tokens = skip == 1;
    Collector col;
    ASSERT_TRUE(stack_->backend->submit(r, col.callback()).is_ok());
    ASSERT_TRUE(col.wait_done());
    EXPECT_EQ(col.tokens(), want);
    EXPECT_EQ(col.events.back().finish_reason, "length");
    texts[skip] = col.text();
  }
  // From the golden ids (not a literal: the bundled model gets retrained).
  auto kept = stack_->codec->decode(want, false);
  auto skipped = stack_->codec->decode(want, true);
  ASSERT_TRUE(kept.is_ok() && skipped.is_ok());
  EXPECT_EQ(texts[0], *kept);
  EXPECT_EQ(texts[1], *skipped);
  EXPECT_EQ(texts[0], texts[1] + "[e~[");  // EOS's text, only when special tokens are kept
}

server::BackendStats wait_for_idle(server::InferenceBackend& b) {
  server::BackendStats s;
  for (int i = 0; i < 500; ++i) {
    s = b.stats();
    if (s.kv_pages_used == 0 && s.num_requests_running == 0 && s.num_requests_waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

TEST_F(ServingTest, CancelFreesPagesAndReportsAbort) {
  auto& b = *stack_->backend;
  const server::BackendStats before = wait_for_idle(b);
  EXPECT_EQ(before.kv_pages_used, 0);
  EXPECT_GT(before.kv_pages_total, 0);
  server::BackendRequest r;
  r.prompt_tokens = ids_of(golden_case("tool_weather_adaptive")["prompt_ids"]);
  r.sampling.temperature = 0.0;
  r.sampling.max_tokens = 3000;
  r.sampling.ignore_eos = true;
  Collector col;
  auto id = b.submit(r, col.callback());
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  ASSERT_TRUE(col.wait_events(3));
  const server::BackendStats during = b.stats();
  EXPECT_GT(during.kv_pages_used, 0);
  b.cancel(*id);
  b.cancel(*id);  // idempotent
  ASSERT_TRUE(col.wait_done());
  EXPECT_EQ(col.events.back().finish_reason, "abort");
  EXPECT_LT(col.tokens().size(), 3000u);
  const server::BackendStats after = wait_for_idle(b);
  EXPECT_EQ(after.kv_pages_used, 0);
  EXPECT_EQ(after.num_requests_running, 0);
}

TEST_F(ServingTest, RepeatedPromptHitsThePrefixCache) {
  auto& b = *stack_->backend;
  const auto prompt = ids_of(golden_case("tool_result_answer_multiturn")["prompt_ids"]);
  const uint64_t hits_before = b.stats().prefix_cache_hit_tokens_total;
  int32_t cached[2] = {-1, -1};
  for (int round = 0; round < 2; ++round) {
    server::BackendRequest r;
    r.prompt_tokens = prompt;
    r.sampling.temperature = 0.0;
    r.sampling.max_tokens = 2;
    Collector col;
    ASSERT_TRUE(b.submit(r, col.callback()).is_ok());
    ASSERT_TRUE(col.wait_done());
    cached[round] = col.events.back().cached_tokens;
  }
  // The second time every full page but the one holding the last prompt token is shared (page =
  // 32 tokens): at least prompt - 64 tokens.
  EXPECT_GE(cached[1], static_cast<int32_t>(prompt.size()) - 64);
  EXPECT_LT(cached[1], static_cast<int32_t>(prompt.size()));
  EXPECT_GE(b.stats().prefix_cache_hit_tokens_total, hits_before + uint64_t(cached[1]));
}

TEST_F(ServingTest, ContextLengthAndBadRequestsAreInvalidArguments) {
  auto& b = *stack_->backend;
  EXPECT_EQ(b.context_length(), 4096);  // max_position_embeddings of m3-tiny
  EXPECT_TRUE(b.ready());
  server::BackendRequest r;
  r.prompt_tokens = {4066, 5};
  r.sampling.max_tokens = 5000;
  Collector col;
  auto id = b.submit(r, col.callback());
  ASSERT_FALSE(id.is_ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  r.sampling.max_tokens = 4;
  r.prompt_tokens = {4066, 1 << 20};
  id = b.submit(r, col.callback());
  ASSERT_FALSE(id.is_ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
}

TEST(SamplingOptions, UnsetFieldsTakeTheGenerationConfigDefaults) {
  SamplingParams defaults;
  defaults.temperature = 1.0f;
  defaults.top_p = 0.95f;
  defaults.top_k = 40;
  server::SamplingOptions o;
  o.max_tokens = 7;
  SamplingParams p = to_sampling_params(o, defaults);
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_FALSE(p.seed.has_value());
  o.temperature = 0.5;
  o.top_p = 0.5;
  o.top_k = 3;
  o.min_p = 0.1;
  o.seed = 42;
  o.presence_penalty = 0.25;
  o.frequency_penalty = -0.5;
  o.repetition_penalty = 1.25;
  o.min_tokens = 2;
  o.ignore_eos = true;
  o.stop = {"x"};
  o.stop_token_ids = {9};
  p = to_sampling_params(o, defaults);
  EXPECT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.top_p, 0.5f);
  EXPECT_EQ(p.top_k, 3);
  EXPECT_FLOAT_EQ(p.min_p, 0.1f);
  EXPECT_EQ(p.seed, 42u);
  EXPECT_EQ(p.presence_penalty, 0.25f);
  EXPECT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_EQ(p.repetition_penalty, 1.25f);
  EXPECT_EQ(p.min_tokens, 2);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(p.stop_token_ids, std::vector<int32_t>{9});
}

TEST_F(ServingTest, GreedyLogprobsAreRawAndSorted) {
  const auto& c = golden_case("chitchat_hello");
  server::BackendRequest r;
  r.request_id = "logprobs";
  r.prompt_tokens = ids_of(c["prompt_ids"]);
  r.sampling.temperature = 0.0;
  r.sampling.repetition_penalty = 1.0;  // greedy on the raw logits: the argmax is the top entry
  r.sampling.max_tokens = 8;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 5;
  Collector col;
  ASSERT_TRUE(stack_->backend->submit(r, col.callback()).is_ok());
  ASSERT_TRUE(col.wait_done());
  size_t n = 0;
  for (const auto& e : col.events) {
    ASSERT_EQ(e.logprobs.size(), e.tokens.size());
    for (size_t i = 0; i < e.tokens.size(); ++i, ++n) {
      const auto& lp = e.logprobs[i];
      ASSERT_EQ(lp.top.size(), 5u);
      EXPECT_EQ(lp.top[0].first, e.tokens[i]);
      EXPECT_EQ(lp.top[0].second, lp.logprob);
      EXPECT_LE(lp.logprob, 0.0f);
      for (size_t k = 1; k < lp.top.size(); ++k) EXPECT_GE(lp.top[k - 1].second, lp.top[k].second);
    }
  }
  EXPECT_EQ(n, col.tokens().size());
  EXPECT_GT(n, 0u);
  // Without logprobs the events carry none.
  r.sampling.logprobs = false;
  r.sampling.top_logprobs = 0;
  Collector plain;
  ASSERT_TRUE(stack_->backend->submit(r, plain.callback()).is_ok());
  ASSERT_TRUE(plain.wait_done());
  for (const auto& e : plain.events) EXPECT_TRUE(e.logprobs.empty());
}

TEST_F(ServingTest, DetokenizerFlushesAnIncompleteTailAsReplacementCharacter) {
  auto tok = load_tokenizer(kModel.string());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  // A character the small vocabulary splits into byte pieces: its tokens but the last end the
  // output mid-character.
  const std::string kReplacement = "\xEF\xBF\xBD";
  std::vector<int32_t> ids;
  for (const char* text : {"Hi \xF0\x9F\x98\x80", "Hi \xE4\xB8\xAD", "Hi \xC3\xA9"}) {
    auto all = stack_->codec->encode(text);
    ASSERT_TRUE(all.is_ok());
    if (all->size() < 2) continue;
    std::vector<int32_t> cut(all->begin(), all->end() - 1);
    auto t = stack_->codec->decode(cut, true);
    if (t.is_ok() && t->size() >= kReplacement.size() &&
        t->compare(t->size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0) {
      ids = cut;
      break;
    }
  }
  ASSERT_FALSE(ids.empty()) << "no character is split into byte pieces by this vocabulary";

  auto tails = std::make_shared<DetokenizerTails>();
  DetokenizerFactory factory = make_detokenizer_factory(*tok, tails);
  GenerateRequest req;
  req.tag = "req-1";
  auto detok = factory(req);
  EXPECT_EQ(tails->size(), 1u);
  std::string streamed;
  for (int32_t id : ids) streamed += detok->push(id);
  // The pieces are held back: they may complete with the next token.
  EXPECT_EQ(streamed, "Hi ");
  const std::string tail = tails->flush("req-1");
  EXPECT_EQ(tail, kReplacement);
  EXPECT_EQ(tails->size(), 0u);
  // Streamed + flushed equals the whole decode (HF's errors="replace").
  auto whole = stack_->codec->decode(ids, true);
  ASSERT_TRUE(whole.is_ok());
  EXPECT_EQ(streamed + tail, *whole);
  EXPECT_EQ(tails->flush("req-1"), "");  // once
  tails->drop("unknown");
}

// A generation that ends mid-character: the engine's last event carries the detokenizer's
// held-back piece as U+FFFD (it used to be dropped). logit_bias forces a byte-piece token.
TEST_F(ServingTest, GenerationEndingMidCharacterEndsWithReplacementCharacter) {
  const std::string kReplacement = "\xEF\xBF\xBD";
  int32_t piece = -1;
  for (const char* text : {"\xF0\x9F\x98\x80", "\xE4\xB8\xAD", "\xC3\xA9"}) {
    auto all = stack_->codec->encode(text);
    ASSERT_TRUE(all.is_ok());
    if (all->size() < 2) continue;
    auto first = stack_->codec->decode({all->front()}, true);
    if (first.is_ok() && *first == kReplacement) {
      piece = all->front();
      break;
    }
  }
  ASSERT_GE(piece, 0) << "no character is split into byte pieces by this vocabulary";
  const auto& c = golden_case("chitchat_hello");
  for (bool skip : {true, false}) {
    server::BackendRequest r;
    r.request_id = "tail";
    r.prompt_tokens = ids_of(c["prompt_ids"]);
    r.sampling.temperature = 0.0;
    r.sampling.max_tokens = 1;
    r.sampling.logit_bias = {{piece, 100.0f}};
    r.skip_special_tokens = skip;
    Collector col;
    ASSERT_TRUE(stack_->backend->submit(r, col.callback()).is_ok());
    ASSERT_TRUE(col.wait_done());
    EXPECT_EQ(col.tokens(), std::vector<int32_t>{piece});
    EXPECT_EQ(col.text(), kReplacement);
    EXPECT_EQ(col.events.back().finish_reason, "length");
  }
}

TEST(EngineStack, KvCacheBytesSizesThePoolAndIsValidated) {
  EngineStackOptions o;
  o.num_threads = 1;
  o.kv_cache_bytes = 4096;  // not even one page
  auto small = make_engine_stack(kModel.string(), o);
  ASSERT_FALSE(small.is_ok());
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  const std::string msg = small.status().message();
  EXPECT_NE(msg.find("--kv-cache-bytes 4096"), std::string::npos) << msg;
  EXPECT_NE(msg.find("context length 4096"), std::string::npos) << msg;

  // Twice the pool, twice the pages (the page size does not depend on the budget).
  o.kv_cache_bytes = int64_t{16} << 20;
  auto a = make_engine_stack(kModel.string(), o);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  const int32_t pages_a = a->backend->stats().kv_pages_total;
  o.kv_cache_bytes = int64_t{32} << 20;
  auto b = make_engine_stack(kModel.string(), o);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  const int32_t pages_b = b->backend->stats().kv_pages_total;
  EXPECT_GT(pages_a, 0);
  EXPECT_LE(std::abs(pages_b - 2 * pages_a), 1) << pages_a << " " << pages_b;

  app::ServeConfig config;
  config.kv_cache_bytes = 123456789;
  auto from = app::options_from_config(config);
  ASSERT_TRUE(from.is_ok());
  EXPECT_EQ(from->kv_cache_bytes, 123456789);
  // Not given: planned (the CPU's default pool, or --mem-fraction-static).
  EXPECT_EQ(app::options_from_config(app::ServeConfig{})->kv_cache_bytes, 0);
  EXPECT_EQ(app::options_from_config(app::ServeConfig{})->default_kv_cache_bytes, int64_t{512} << 20);
  config.kv_cache_bytes = 0;
  config.mem_fraction_static = 0.8;
  EXPECT_EQ(app::options_from_config(config)->mem_fraction_static, 0.8);
}

TEST(EngineStack, MissingModelDirectoryIsNamed) {
  auto s = make_engine_stack("/nonexistent/m3", EngineStackOptions{});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("/nonexistent/m3"), std::string::npos);
}

}  // namespace
}  // namespace m3::serving
