// `m3serve serve`'s flags: SGLang's names, hints for unknown flags, the hidden fake-backend flags.
#include <gtest/gtest.h>

#include <chrono>

#include "app/serve_flags.h"

namespace m3::app {
namespace {

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
  EXPECT_EQ(f->config.model_path, "/m/M3");
  EXPECT_EQ(f->config.server.port, 8000);
  EXPECT_EQ(f->config.server.api_key, "k");
  EXPECT_EQ(f->config.server.tool_call_parser, "none");
  EXPECT_EQ(f->config.chunked_prefill_size, 4096);
  EXPECT_EQ(f->config.tp, 2);
  EXPECT_DOUBLE_EQ(f->config.mem_fraction_static, 0.85);
  EXPECT_EQ(f->config.server.context_length, 32768);
  EXPECT_EQ(f->config.server.served_model_names, (std::vector<std::string>{"m3", "alias"}));
  EXPECT_EQ(f->config.server.media.allowed_domains, (std::vector<std::string>{"a.com", ".b.org"}));
  auto underscores = parse_serve_flags({"--model_path", "x"});
  ASSERT_TRUE(underscores.is_ok());
  EXPECT_EQ(underscores->config.model_path, "x");
  EXPECT_EQ(parse_serve_flags({})->config.server.served_model_names.front(), "m3-tiny");
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


TEST(ServeFlags, HelpAndTheFakeBackendFlags) {
  auto h = parse_serve_flags({"--help"});
  ASSERT_TRUE(h.is_ok());
  EXPECT_TRUE(h->help);
  EXPECT_NE(serve_help().find("--max-connections"), std::string::npos);
  // The fake backend's flags are hidden from the help and parsed beside the fake.
  EXPECT_EQ(serve_help().find("--fake"), std::string::npos);
  auto f = parse_serve_flags({"--fake-backend", "--fake-step-ms", "7", "--fake-load-ms=30",
                              "--fake-tokens-per-step", "3", "--fake-max-running", "5"});
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_TRUE(f->config.fake.enabled);
  EXPECT_EQ(f->config.fake.backend.step_ms, 7);
  EXPECT_EQ(f->config.fake.backend.tokens_per_step, 3);
  EXPECT_EQ(f->config.fake.backend.max_running, 5);
  EXPECT_EQ(f->config.fake.load_time, std::chrono::milliseconds(30));
  EXPECT_FALSE(parse_serve_flags({"--fake-step-ms", "-1"}).is_ok());
  EXPECT_FALSE(parse_serve_flags({"--fake-backend=1"}).is_ok());
  EXPECT_FALSE(parse_serve_flags({}).value().config.fake.enabled);
}

TEST(ServeFlags, ConnectionLimits) {
  auto f = parse_serve_flags({"--max-connections", "100", "--keep-alive-timeout", "2.5"});
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->config.server.max_connections, 100);
  EXPECT_EQ(f->config.server.keep_alive_timeout, std::chrono::milliseconds(2500));
  EXPECT_FALSE(parse_serve_flags({"--max-connections", "0"}).is_ok());
  EXPECT_FALSE(parse_serve_flags({"--keep-alive-timeout", "0"}).is_ok());
}

}  // namespace
}  // namespace m3::app
