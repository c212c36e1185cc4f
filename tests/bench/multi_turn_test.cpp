// The multi-turn workload: its requests, the bodies that carry a conversation's history, the
// cached-token count read from the usage, the prefix-hit aggregate, and its flags.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "bench/bench_command.h"
#include "bench/openai_stream.h"
#include "bench/stats.h"
#include "bench/workload.h"

namespace m3::bench {
namespace {

TEST(bench_multi_turn, ConversationsAreConsecutiveTurnsOfTextPrompts) {
  WorkloadOptions o;
  o.dataset = DatasetKind::kMultiTurn;
  o.num_conversations = 3;
  o.turns = 4;
  o.input_len = 5;
  o.output_len = 7;
  o.token_ids = false;
  auto w = make_workload(o);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ASSERT_EQ(w->size(), 12u);
  for (size_t i = 0; i < w->size(); ++i) {
    const BenchRequest& r = (*w)[i];
    EXPECT_EQ(r.conversation, static_cast<int>(i / 4));
    EXPECT_EQ(r.turn, static_cast<int>(i % 4));
    EXPECT_EQ(r.output_len, 7);
    EXPECT_TRUE(r.prompt_ids.empty());
    EXPECT_EQ(std::count(r.prompt_text.begin(), r.prompt_text.end(), ' '), 4);  // 5 words
  }
  EXPECT_NE((*w)[0].prompt_text, (*w)[1].prompt_text);
  o.turns = 0;
  auto bad = make_workload(o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--turns"), std::string::npos);
}

TEST(bench_multi_turn, BodiesCarryTheHistory) {
  BenchRequest req;
  req.output_len = 4;
  req.prompt_text = "third question";
  GenerationParams params;
  params.model = "m";
  const std::vector<std::string> history = {"first question", "first answer", "second question",
                                            "second answer"};
  auto chat = nlohmann::json::parse(request_body(Backend::kOpenAiChat, params, req, history));
  ASSERT_EQ(chat["messages"].size(), 5u);
  EXPECT_EQ(chat["messages"][0]["role"], "user");
  EXPECT_EQ(chat["messages"][1]["role"], "assistant");
  EXPECT_EQ(chat["messages"][1]["content"], "first answer");
  EXPECT_EQ(chat["messages"][4]["content"], "third question");
  auto completion =
      nlohmann::json::parse(request_body(Backend::kOpenAiCompletions, params, req, history));
  EXPECT_EQ(completion["prompt"],
            "first question\nfirst answer\nsecond question\nsecond answer\nthird question");
}

TEST(bench_multi_turn, ReaderKeepsTheAnswerAndCachedTokens) {
  StreamReader reader(Backend::kOpenAiChat, /*keep_text=*/true);
  reader.on_bytes("data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"think\"}}]}\n\n", 0.1);
  reader.on_bytes("data: {\"choices\":[{\"delta\":{\"content\":\"an \"}}]}\n\n", 0.2);
  reader.on_bytes("data: {\"choices\":[{\"delta\":{\"content\":\"answer\"}}]}\n\n", 0.3);
  reader.on_bytes(
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":3,"
      "\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\ndata: [DONE]\n\n",
      0.4);
  RequestResult r;
  r.http_status = 200;
  reader.finish(r, 0.5, "");
  EXPECT_TRUE(r.success) << r.error;
  EXPECT_EQ(r.output_text, "an answer");  // content only: reasoning is not sent back
  EXPECT_EQ(r.cached_tokens, 64);
  // Without keep_text (independent requests) nothing is copied; no usage detail: -1.
  StreamReader plain(Backend::kOpenAiChat);
  plain.on_bytes("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", 0.1);
  RequestResult p;
  p.http_status = 200;
  plain.finish(p, 0.2, "");
  EXPECT_EQ(p.output_text, "");
  EXPECT_EQ(p.cached_tokens, -1);
}

TEST(bench_multi_turn, HitRateIsCachedOverPromptTokensOfReportingRequests) {
  std::vector<RequestResult> rs(4);
  for (RequestResult& r : rs) r.success = true;
  rs[0].prompt_tokens = 100;
  rs[0].cached_tokens = 0;
  rs[1].prompt_tokens = 200;
  rs[1].cached_tokens = 96;
  rs[2].prompt_tokens = 300;
  rs[2].cached_tokens = 192;
  rs[3].prompt_tokens = 1000;  // reports no cached_tokens: left out of the rate
  rs[3].cached_tokens = -1;
  Aggregate a = aggregate(rs, 1.0);
  EXPECT_TRUE(a.cache_reported);
  EXPECT_EQ(a.total_cached_tokens, 288);
  EXPECT_DOUBLE_EQ(a.prefix_hit_rate, 288.0 / 600.0);
  rs.resize(1);
  rs[0].cached_tokens = -1;
  a = aggregate(rs, 1.0);
  EXPECT_FALSE(a.cache_reported);
}

TEST(bench_multi_turn, Flags) {
  auto f = parse_bench_flags({"--dataset", "multi-turn", "--num-conversations", "5", "--turns",
                              "3", "--backend", "openai-completions"});
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->workload.dataset, DatasetKind::kMultiTurn);
  EXPECT_EQ(f->workload.num_prompts, 15);
  EXPECT_FALSE(f->workload.token_ids);  // the history is text
  auto alone = parse_bench_flags({"--turns", "3"});
  ASSERT_FALSE(alone.is_ok());
  EXPECT_NE(alone.status().message().find("--turns needs --dataset multi-turn"),
            std::string::npos);
  auto both = parse_bench_flags({"--dataset", "multi-turn", "--num-prompts", "10"});
  ASSERT_FALSE(both.is_ok());
  EXPECT_NE(both.status().message().find("--num-prompts"), std::string::npos);
  auto bad = parse_bench_flags({"--dataset", "chatty"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("multi-turn"), std::string::npos);
}

}  // namespace
}  // namespace m3::bench
