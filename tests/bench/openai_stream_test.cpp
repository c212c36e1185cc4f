// Reading one streamed response into timings and counts; request bodies; flag parsing.
#include "bench/openai_stream.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "bench/bench_command.h"

namespace m3::bench {
namespace {

std::string event(const std::string& json) {
  return "data: " + json + "\n\n";
}
std::string text_chunk(const std::string& text) {
  return event(R"({"choices":[{"index":0,"text":")" + text + R"(","finish_reason":null}]})");
}

TEST(bench_stream, CompletionsTimingsAndUsage) {
  StreamReader reader(Backend::kOpenAiCompletions);
  reader.on_bytes(text_chunk(""), 0.05);  // empty text: not the first token
  reader.on_bytes(text_chunk("a"), 0.10);
  const std::string two = text_chunk("b") + text_chunk("c");
  reader.on_bytes(two.substr(0, 10), 0.20);  // a chunk completes only with its blank line
  reader.on_bytes(two.substr(10), 0.30);
  reader.on_bytes(event(R"({"choices":[],"usage":{"prompt_tokens":32,"completion_tokens":4}})"),
                  0.35);
  reader.on_bytes(event("[DONE]"), 0.36);
  RequestResult r;
  r.http_status = 200;
  r.prompt_tokens = 30;
  reader.finish(r, 0.40, "");
  EXPECT_TRUE(r.success) << r.error;
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.10);
  ASSERT_EQ(r.itl_s.size(), 2u);  // b and c arrived in the same read: a zero gap
  EXPECT_NEAR(r.itl_s[0], 0.20, 1e-12);
  EXPECT_NEAR(r.itl_s[1], 0.0, 1e-12);
  EXPECT_EQ(r.output_tokens, 4);   // usage wins over the 3 chunks
  EXPECT_EQ(r.prompt_tokens, 32);  // usage wins over the planned length
  EXPECT_DOUBLE_EQ(r.latency_s, 0.40);
}

TEST(bench_stream, WithoutUsageCountsChunks) {
  StreamReader reader(Backend::kOpenAiChat);
  reader.on_bytes(event(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})"), 0.1);
  reader.on_bytes(event(R"({"choices":[{"delta":{"reasoning_content":"hm"}}]})"), 0.2);
  reader.on_bytes(event(R"({"choices":[{"delta":{"content":"ok"}}]})"), 0.3);
  RequestResult r;
  r.http_status = 200;
  reader.finish(r, 0.4, "");
  EXPECT_TRUE(r.success);
  EXPECT_EQ(r.output_tokens, 2);
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.2);
}

TEST(bench_stream, FailuresCarryStatusAndMessage) {
  {
    StreamReader reader(Backend::kOpenAiCompletions);
    reader.on_bytes(R"({"error":{"message":"max_tokens is too large","code":400}})", 0.01);
    RequestResult r;
    r.http_status = 400;
    reader.finish(r, 0.02, "");
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.error, "HTTP 400: max_tokens is too large");
  }
  {
    StreamReader reader(Backend::kOpenAiCompletions);
    reader.on_bytes(text_chunk("a"), 0.1);
    reader.on_bytes(event(R"({"error":{"message":"engine died"}})"), 0.2);
    RequestResult r;
    r.http_status = 200;
    reader.finish(r, 0.3, "");
    EXPECT_FALSE(r.success);
    EXPECT_NE(r.error.find("engine died"), std::string::npos);
  }
  {
    StreamReader reader(Backend::kOpenAiCompletions);
    RequestResult r;
    reader.finish(r, 0.01, "connect to 127.0.0.1:1: Connection refused");
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.http_status, 0);
    EXPECT_NE(r.error.find("Connection refused"), std::string::npos);
  }
  {
    StreamReader reader(Backend::kOpenAiCompletions);
    reader.on_bytes(event("[DONE]"), 0.1);
    RequestResult r;
    r.http_status = 200;
    reader.finish(r, 0.2, "");
    EXPECT_FALSE(r.success);  // no generated text at all
  }
}

TEST(bench_stream, RequestBodies) {
  BenchRequest req;
  req.input_len = 3;
  req.output_len = 8;
  req.prompt_ids = {5, 6, 7};
  GenerationParams params;
  params.model = "m";
  auto body = nlohmann::json::parse(request_body(Backend::kOpenAiCompletions, params, req));
  EXPECT_EQ(body["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  req.prompt_ids.clear();
  req.prompt_text = "hello world";
  params.ignore_eos = false;
  params.extra_body = R"({"top_p":0.9,"temperature":0.6})";
  body = nlohmann::json::parse(request_body(Backend::kOpenAiChat, params, req));
  EXPECT_EQ(body["messages"][0]["content"], "hello world");
  EXPECT_FALSE(body.contains("ignore_eos"));
  EXPECT_EQ(body["top_p"], 0.9);
  EXPECT_EQ(body["temperature"], 0.6);  // the extra body wins over the flag's default
  EXPECT_EQ(body["stream"], true);
}

TEST(bench_flags, DefaultsAndValues) {
  auto f = parse_bench_flags({});
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->base_url, "http://127.0.0.1:30000");
  EXPECT_TRUE(std::isinf(f->run.request_rate));
  EXPECT_EQ(f->run.max_concurrency, 0);
  f = parse_bench_flags({"--port", "8000", "--num-prompts", "16", "--max-concurrency=4",
                         "--request-rate", "2.5", "--random-input-len", "32", "--random-output-len",
                         "8", "--backend", "openai-chat"});
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->run.endpoint.port, "8000");
  EXPECT_EQ(f->workload.num_prompts, 16);
  EXPECT_EQ(f->run.max_concurrency, 4);
  EXPECT_EQ(f->run.request_rate, 2.5);
  EXPECT_EQ(f->workload.input_len, 32);
  EXPECT_EQ(f->workload.output_len, 8);
  EXPECT_FALSE(f->workload.token_ids);  // chat sends text
  f = parse_bench_flags({"--base-url", "http://example.org:9000/api/"});
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->run.endpoint.host, "example.org");
  EXPECT_EQ(f->run.endpoint.port, "9000");
  EXPECT_EQ(f->run.endpoint.path_prefix, "/api");
}

TEST(bench_flags, ApiKeyFromTheEnvironmentUnlessGiven) {
  setenv("OPENAI_API_KEY", "from-env", 1);
  auto f = parse_bench_flags({});
  auto g = parse_bench_flags({"--api-key", "flag"});
  unsetenv("OPENAI_API_KEY");
  ASSERT_TRUE(f.is_ok() && g.is_ok());
  EXPECT_EQ(f->run.api_key, "from-env");
  EXPECT_EQ(g->run.api_key, "flag");
}

TEST(bench_flags, ErrorsNameTheFlag) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--max-concurrency", "0"},
                                             {"--request-rate", "-1"},
                                             {"--num-prompts", "ten"},
                                             {"--backend", "grpc"},
                                             {"--base-url", "https://x"},
                                             {"--extra-request-body", "[1]"},
                                             {"--request-timeout", "-2"},
                                             {"--port"},
                                             {"--frobnicate", "1"}}) {
    auto f = parse_bench_flags(args);
    ASSERT_FALSE(f.is_ok()) << args[0];
    EXPECT_NE(f.status().message().find(args[0]), std::string::npos) << f.status().message();
  }
}

}  // namespace
}  // namespace m3::bench
