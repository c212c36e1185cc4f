#include <gtest/gtest.h>

#include "server/handlers/routes.h"
#include "server/metrics.h"
#include "server/serve_command.h"

namespace m3::server {
namespace {

TEST(Metrics, RequiredNamesAndHistograms) {
  Metrics m("m3-tiny");
  m.time_to_first_token.observe(0.003);
  m.time_to_first_token.observe(0.3);
  m.inter_token_latency.observe(0.02);
  m.count_finished("stop");
  BackendStats s;
  s.num_requests_running = 3;
  s.num_requests_waiting = 2;
  s.kv_pages_used = 10;
  s.kv_pages_cached = 4;
  s.kv_pages_total = 100;
  s.prefix_cache_hit_tokens_total = 256;
  std::string text = m.render(s, true, false);
  for (const char* line :
       {"m3serve:num_requests_running{model_name=\"m3-tiny\"} 3",
        "m3serve:num_requests_waiting{model_name=\"m3-tiny\"} 2",
        "m3serve:kv_pages_used{model_name=\"m3-tiny\"} 10",
        "m3serve:kv_pages_cached{model_name=\"m3-tiny\"} 4",
        "m3serve:kv_pages_total{model_name=\"m3-tiny\"} 100",
        "m3serve:prefix_cache_hit_tokens_total{model_name=\"m3-tiny\"} 256",
        "# TYPE m3serve:time_to_first_token_seconds histogram",
        "m3serve:time_to_first_token_seconds_bucket{model_name=\"m3-tiny\",le=\"0.005\"} 1",
        "m3serve:time_to_first_token_seconds_bucket{model_name=\"m3-tiny\",le=\"0.25\"} 1",
        "m3serve:time_to_first_token_seconds_bucket{model_name=\"m3-tiny\",le=\"0.5\"} 2",
        "m3serve:time_to_first_token_seconds_bucket{model_name=\"m3-tiny\",le=\"+Inf\"} 2",
        "m3serve:time_to_first_token_seconds_count{model_name=\"m3-tiny\"} 2",
        "# TYPE m3serve:inter_token_latency_seconds histogram",
        "m3serve:request_success_total{model_name=\"m3-tiny\",finished_reason=\"stop\"} 1"}) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << text;
  }
}

TEST(Auth, BearerComparison) {
  EXPECT_TRUE(authorized("sk-1", "Bearer sk-1"));
  EXPECT_FALSE(authorized("sk-1", "Bearer sk-2"));
  EXPECT_FALSE(authorized("sk-1", "Bearer sk-1x"));
  EXPECT_TRUE(authorized("sk-1", "bearer sk-1"));  // the scheme is case-insensitive
  EXPECT_FALSE(authorized("sk-1", "bearer SK-1"));  // the key is not
  EXPECT_FALSE(authorized("sk-1", ""));
}

TEST(ServeFlags, SGLangNames) {
  auto f = parse_serve_flags({"--model-path",
                              "/m/M3",
                              "--host",
                              "127.0.0.1",
                              "--port=8000",
                              "--api-key",
                              "k",
                              "--reasoning-parser",
                              "minimax-m3",
                              "--tool-call-parser",
                              "none",
                              "--chunked-prefill-size",
                              "4096",
                              "--max-running-requests",
                              "64",
                              "--mem-fraction-static",
                              "0.85",
                              "--context-length",
                              "32768",
                              "--load-format",
                              "dummy",
                              "--served-model-name",
                              "m3,alias",
                              "--tp",
                              "2",
                              "--revision",
                              "main",
                              "--trust-remote-code",
                              "--allowed-media-domains",
                              "a.com,.b.org"});
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->model_path, "/m/M3");
  EXPECT_EQ(f->server.port, 8000);
  EXPECT_EQ(f->server.api_key, "k");
  EXPECT_EQ(f->server.tool_call_parser, "none");
  EXPECT_EQ(f->chunked_prefill_size, 4096);
  EXPECT_EQ(f->tp, 2);
  EXPECT_DOUBLE_EQ(f->mem_fraction_static, 0.85);
  EXPECT_EQ(f->server.context_length, 32768);
  EXPECT_EQ(f->server.served_model_names, (std::vector<std::string>{"m3", "alias"}));
  EXPECT_EQ(f->server.media.allowed_domains, (std::vector<std::string>{"a.com", ".b.org"}));
  auto underscores = parse_serve_flags({"--model_path", "x"});
  ASSERT_TRUE(underscores.is_ok());
  EXPECT_EQ(underscores->model_path, "x");
  EXPECT_EQ(parse_serve_flags({})->server.served_model_names.front(), "m3-tiny");
}

TEST(ServeFlags, ErrorsWithHints) {
  auto f = parse_serve_flags({"--model-pth", "x"});
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find("did you mean '--model-path'"), std::string::npos)
      << f.status().message();
  auto g = parse_serve_flags({"--mem-fraction", "0.8"});
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("--mem-fraction-static"), std::string::npos);
  EXPECT_FALSE(parse_serve_flags({"--port", "http"}).is_ok());
  EXPECT_FALSE(parse_serve_flags({"--port"}).is_ok());
  EXPECT_FALSE(parse_serve_flags({"--reasoning-parser", "deepseek-r1"}).is_ok());
  EXPECT_FALSE(parse_serve_flags({"--mem-fraction-static", "1.5"}).is_ok());
  EXPECT_FALSE(parse_serve_flags({"stray"}).is_ok());
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace m3::server
