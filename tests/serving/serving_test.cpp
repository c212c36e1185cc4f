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

#include "serving/engine_stack.h"

namespace m3::serving {
namespace {

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
  EXPECT_EQ(texts[0], "</mm:think>Hi! What can I do for you?[e~[");
  EXPECT_EQ(texts[1], "</mm:think>Hi! What can I do for you?");
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

TEST(EngineStack, MissingModelDirectoryIsNamed) {
  auto s = make_engine_stack("/nonexistent/m3", EngineStackOptions{});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("/nonexistent/m3"), std::string::npos);
}

}  // namespace
}  // namespace m3::serving
