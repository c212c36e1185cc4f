#include "sample/sampling_params.h"

#include <gtest/gtest.h>

namespace m3 {
namespace {

TEST(SamplingParams, GenerationConfigDefaults) {
  // MiniMax-M3's generation_config.json (m3-architecture.md §1.5).
  auto d = parse_generation_config(
      R"({"do_sample": true, "temperature": 1.0, "top_p": 0.95, "top_k": 40,
          "bos_token_id": 200034, "eos_token_id": 200020})",
      "generation_config.json");
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_FLOAT_EQ(d->top_p, 0.95f);
  EXPECT_EQ(d->top_k, 40);
  EXPECT_EQ(d->eos_token_ids, (std::vector<int32_t>{200020}));
  SamplingParams p = default_sampling_params(*d);
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_EQ(p.top_k, 40);

  auto list = parse_generation_config(R"({"eos_token_id": [1, 2]})", "g.json");
  EXPECT_EQ(list->eos_token_ids, (std::vector<int32_t>{1, 2}));
  auto bad = parse_generation_config(R"({"top_p": "high"})", "g.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("top_p"), std::string::npos);
  EXPECT_FALSE(parse_generation_config("{", "g.json").is_ok());
}

TEST(SamplingParams, ValidationNamesParameterAndValue) {
  SamplingParams p;
  EXPECT_TRUE(validate_sampling_params(p, 100).is_ok());
  auto expect_bad = [](SamplingParams q, const std::string& needle) {
    Status st = validate_sampling_params(q, 100);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  SamplingParams q = p;
  q.temperature = -1;
  expect_bad(q, "temperature");
  q = p;
  q.top_p = 0;
  expect_bad(q, "top_p");
  q = p;
  q.min_p = 1.5f;
  expect_bad(q, "min_p");
  q = p;
  q.repetition_penalty = 0;
  expect_bad(q, "repetition_penalty");
  q = p;
  q.presence_penalty = 3;
  expect_bad(q, "presence_penalty");
  q = p;
  q.logit_bias = {{100, 1.0f}};
  expect_bad(q, "logit_bias token id 100");
  q = p;
  q.logit_bias = {{1, 200.0f}};
  expect_bad(q, "logit_bias for token 1");
  q = p;
  q.n = 0;
  expect_bad(q, "n = 0");
  q = p;
  q.stop = {""};
  expect_bad(q, "stop");
  q = p;
  q.max_tokens = 0;
  expect_bad(q, "max_tokens");
  q = p;
  q.max_tokens = 3;
  q.min_tokens = 4;
  expect_bad(q, "min_tokens");
  q = p;
  q.top_logprobs = 21;
  expect_bad(q, "top_logprobs");
  q = p;
  q.stop_token_ids = {-1};
  expect_bad(q, "stop_token_ids");
}

}  // namespace
}  // namespace m3
