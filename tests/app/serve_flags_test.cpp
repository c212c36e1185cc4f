// `m3serve serve`'s flags: SGLang's names, hints for unknown flags, the hidden fake-backend flags.
#include <gtest/gtest.h>

#include <chrono>

#include "app/engine_stack.h"
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

namespace m3::app {
namespace {

// A summary of everything a flag can set, to tell a config from the default one.
std::string summary(const ServeConfig& c) {
  std::string s;
  auto add = [&](const auto& v) { s += std::to_string(v) + "|"; };
  s += c.model_path + "|" + c.revision + "|" + c.load_format + "|" + c.device + "|" +
       c.kv_cache_dtype + "|" + c.speculative_algorithm + "|" + c.server.host + "|" +
       c.server.api_key + "|" + c.server.reasoning_parser + "|" + c.server.tool_call_parser + "|";
  for (const auto& n : c.server.served_model_names) s += n + ",";
  for (const auto& d : c.server.media.allowed_domains) s += d + ",";
  add(c.chunked_prefill_size); add(c.max_running_requests); add(c.max_queued_requests);
  add(c.kv_cache_bytes); add(c.mem_fraction_static); add(c.tp); add(c.dp); add(c.ep);
  add(c.enable_dp_attention); add(c.enable_expert_parallel); add(c.enable_hierarchical_cache);
  add(c.hicache_size_gb); add(c.speculative_block_verification); add(c.server.port);
  add(c.server.context_length); add(c.server.max_body_bytes); add(c.server.max_connections);
  add(c.server.keep_alive_timeout.count()); add(c.server.io_threads);
  add(c.server.worker_threads); add(c.server.media.max_image_bytes);
  add(c.server.media.max_image_pixels);
  add(c.server.drain_timeout.count());
  add(c.nnodes); add(c.node_rank); s += c.dist_init_addr + "|"; add(c.dist_timeout_s);
  s += c.load_balance_method + "|";
  add(c.disable_custom_all_reduce);
  s += c.speculative_draft_model_path + "|";
  add(c.speculative_num_draft_tokens);
  add(c.speculative_simulate_accept_length);
  return s;
}

// Every flag either changes the configuration or leaves a startup notice that names it: nothing
// is parsed and then dropped.
TEST(ServeFlags, EveryFlagTakesEffectOrSaysWhyNot) {
  const ServeConfig defaults = parse_serve_flags({})->config;
  const auto examples = serve_flag_examples();
  ASSERT_GT(examples.size(), 40u);
  for (const FlagExample& f : examples) {
    std::vector<std::string> args = {f.name};
    if (!f.value.empty()) args.push_back(f.value);
    auto parsed = parse_serve_flags(args);
    ASSERT_TRUE(parsed.is_ok()) << f.name << " " << f.value << ": " << parsed.status().message();
    const bool changed = summary(parsed->config) != summary(defaults);
    bool noted = false;
    for (const std::string& n : parsed->config.notices) noted |= n.rfind(f.name, 0) == 0;
    EXPECT_TRUE(changed || noted) << f.name << " " << f.value
                                  << " neither changes the config nor says why not";
    if (!f.alias) {
      EXPECT_NE(serve_help().find(f.name), std::string::npos) << f.name << " missing from --help";
    }
  }
}

// The deployment guide's quickstart parses; the features it names that are not built yet are
// refused by name when the server starts (options_from_config), the inert ones leave notices.
TEST(ServeFlags, TheGuidesQuickstartIsUnderstood) {
  auto f = parse_serve_flags(
      {"--trust-remote-code", "--model-path", "MiniMaxAI/MiniMax-M3.1-Flash", "--revision", "main",
       "--reasoning-parser", "minimax-m3", "--tool-call-parser", "minimax-m3", "--tp", "4",
       "--moe-runner-backend", "flashinfer_trtllm_routed", "--speculative-algorithm", "DSPARK",
       "--speculative-use-block-verification", "--cuda-graph-backend-prefill", "breakable",
       "--chunked-prefill-size", "32768", "--max-running-requests", "128",
       "--cuda-graph-max-bs-decode", "128", "--mem-fraction-static", "0.8",
       "--tokenizer-worker-num", "8", "--host", "0.0.0.0", "--port", "30000"});
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->config.server.served_model_names.front(), "MiniMaxAI/MiniMax-M3.1-Flash");
  for (const char* inert : {"--trust-remote-code", "--moe-runner-backend",
                            "--cuda-graph-backend-prefill", "--cuda-graph-max-bs-decode"}) {
    bool noted = false;
    for (const std::string& n : f->config.notices) noted |= n.rfind(inert, 0) == 0;
    EXPECT_TRUE(noted) << inert;
  }
  EXPECT_EQ(f->config.mem_fraction_static, 0.8) << "plans the KV pool (memory_plan.h)";
  // --tp 4 runs (CPU ranks, or GPU ranks on the real-shape kernels); DSPARK over ranks is
  // refused.
  auto refused = options_from_config(f->config);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("--speculative-algorithm DSPARK"), std::string::npos)
      << refused.status().message();
  f->config.speculative_algorithm.clear();
  auto accepted = options_from_config(f->config);
  ASSERT_TRUE(accepted.is_ok()) << accepted.status().message();
  EXPECT_EQ(accepted->tensor_parallel, 4);
  for (auto [flags, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--speculative-algorithm", "DSPARK", "--device", "cuda"},
            "--speculative-algorithm DSPARK with --device cuda"},
           {{"--dp", "2"}, "--dp 2"},
           {{"--kv-cache-dtype", "fp8_e4m3"}, "--kv-cache-dtype fp8_e4m3"},
           {{"--enable-hierarchical-cache"}, "--enable-hierarchical-cache"}}) {
    auto g = parse_serve_flags(flags);
    ASSERT_TRUE(g.is_ok());
    auto o = options_from_config(g->config);
    ASSERT_FALSE(o.is_ok()) << named;
    EXPECT_EQ(o.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(o.status().message().find(named), std::string::npos) << o.status().message();
  }
  // --ep takes effect (CPU ranks): SGLang's meaning, the expert-parallel ranks among --tp's.
  auto e = parse_serve_flags({"--tp", "4", "--ep", "2"});
  ASSERT_TRUE(e.is_ok());
  auto eo = options_from_config(e->config);
  ASSERT_TRUE(eo.is_ok()) << eo.status().message();
  EXPECT_EQ(eo->tensor_parallel, 4);
  EXPECT_EQ(eo->expert_parallel, 2);
  // vLLM's names mean the same.
  auto v = parse_serve_flags({"--tensor-parallel-size", "2", "--max-model-len", "4096",
                              "--gpu-memory-utilization", "0.9", "--block-size", "128"});
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->config.tp, 2);
  EXPECT_EQ(v->config.server.context_length, 4096);
  EXPECT_DOUBLE_EQ(v->config.mem_fraction_static, 0.9);
  EXPECT_FALSE(parse_serve_flags({"--block-size", "16"}).is_ok());
}

// --speculative-*: SGLang's flags on the CPU path; the benchmark-only forced acceptance needs
// dummy weights; anything else than DSPARK is refused by name.
TEST(ServeFlags, Speculative) {
  auto f = parse_serve_flags({"--speculative-algorithm", "DSPARK", "--speculative-draft-model-path",
                              "/d", "--speculative-num-draft-tokens", "5",
                              "--speculative-use-block-verification"});
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  auto o = options_from_config(f->config);
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  EXPECT_TRUE(o->speculative);
  EXPECT_EQ(o->draft_model_path, "/d");
  EXPECT_EQ(o->speculative_options.num_draft_tokens, 5);
  EXPECT_EQ(o->speculative_options.method, VerifyMethod::kBlock);
  EXPECT_EQ(o->speculative_options.simulate_accept_length, 0);

  auto eagle = parse_serve_flags({"--speculative-algorithm", "EAGLE3"});
  ASSERT_FALSE(eagle.is_ok());
  EXPECT_NE(eagle.status().message().find("--speculative-algorithm"), std::string::npos);
  EXPECT_FALSE(parse_serve_flags({"--speculative-num-draft-tokens", "1"}).is_ok());

  auto sim = parse_serve_flags(
      {"--speculative-algorithm", "DSPARK", "--speculative-simulate-accept-length", "3"});
  ASSERT_TRUE(sim.is_ok());
  auto refused = options_from_config(sim->config);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("--load-format dummy"), std::string::npos);
  sim->config.load_format = "dummy";
  auto accepted = options_from_config(sim->config);
  ASSERT_TRUE(accepted.is_ok()) << accepted.status().message();
  EXPECT_EQ(accepted->speculative_options.simulate_accept_length, 3);

  for (const auto& ranks : std::vector<std::vector<std::string>>{
           {"--tp", "2"}, {"--ep", "2"}, {"--nnodes", "2", "--dist-init-addr", "h:1"}}) {
    std::vector<std::string> args = {"--speculative-algorithm", "DSPARK"};
    args.insert(args.end(), ranks.begin(), ranks.end());
    auto g = parse_serve_flags(args);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    auto r = options_from_config(g->config);
    ASSERT_FALSE(r.is_ok()) << ranks[0];
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(r.status().message().find("--speculative-algorithm DSPARK with --tp"),
              std::string::npos)
        << r.status().message();
  }
}

// --enable-dp-attention --dp D: D divides --tp; --dp without it (replicas) is refused by name;
// --load-balance-method takes SGLang's names only.
TEST(ServeFlags, DataParallelAttention) {
  auto options = [](std::vector<std::string> args) {
    auto f = parse_serve_flags(args);
    EXPECT_TRUE(f.is_ok()) << f.status().message();
    return options_from_config(f->config);
  };
  auto ok = options({"--tp", "4", "--dp", "2", "--enable-dp-attention", "--load-balance-method",
                     "minimum_tokens"});
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok->dp_attention, 2);
  EXPECT_EQ(ok->tensor_parallel, 4);
  EXPECT_EQ(ok->load_balance, LoadBalanceMethod::kMinimumTokens);
  auto alias = options({"--tp", "4", "--dp-size", "4", "--enable-dp-attention"});
  ASSERT_TRUE(alias.is_ok()) << alias.status().message();
  EXPECT_EQ(alias->dp_attention, 4);
  EXPECT_EQ(alias->load_balance, LoadBalanceMethod::kRoundRobin);
  // --ep 4 alone runs 4 ranks: --dp 2 divides them.
  auto ep = options({"--ep", "4", "--dp", "2", "--enable-dp-attention"});
  ASSERT_TRUE(ep.is_ok()) << ep.status().message();

  auto bad = options({"--tp", "4", "--dp", "3", "--enable-dp-attention"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--dp 3"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("--tp 4"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(options({"--dp", "2", "--enable-dp-attention"}).is_ok()) << "--tp 1";

  auto replicas = options({"--tp", "4", "--dp", "2"});
  ASSERT_FALSE(replicas.is_ok());
  EXPECT_EQ(replicas.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(replicas.status().message().find("without --enable-dp-attention"), std::string::npos)
      << replicas.status().message();

  auto method = parse_serve_flags({"--load-balance-method", "random"});
  ASSERT_FALSE(method.is_ok());
  for (const char* named : {"--load-balance-method", "random", "round_robin", "minimum_tokens"}) {
    EXPECT_NE(method.status().message().find(named), std::string::npos)
        << method.status().message();
  }
  // Without DP attention the method has one group to choose from: a notice says so.
  auto inert = parse_serve_flags({"--load-balance-method", "shortest_queue"});
  ASSERT_TRUE(inert.is_ok());
  bool noted = false;
  for (const std::string& n : inert->config.notices) noted |= n.rfind("--load-balance-method", 0) == 0;
  EXPECT_TRUE(noted);
}

// The engine stack builds the runner with its attention groups and an engine over them, the pool
// planned per group; a --dp that does not divide --tp is refused naming both.
TEST(ServeFlags, DataParallelAttentionEngine) {
  EngineStackOptions o;
  o.device = "cpu";
  o.num_threads = 4;
  o.tensor_parallel = 4;
  o.dp_attention = 2;
  auto e = make_engine(std::string(M3_REPO_ROOT) + "/models/m3-tiny", o);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_EQ(e->engine->scheduler().num_dp_groups(), 2);
  bool per_group = false;
  for (const std::string& line : e->report) per_group |= line.find("per DP group") != std::string::npos;
  EXPECT_TRUE(per_group);
  o.dp_attention = 3;
  auto bad = make_engine(std::string(M3_REPO_ROOT) + "/models/m3-tiny", o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().message();
  // On GPU ranks it is not built: refused before anything loads, naming --dp.
  o.dp_attention = 2;
  o.device = "cuda";
  o.make_backend = [](const std::string&, int) -> Result<std::unique_ptr<Backend>> {
    return internal_error("no backend in this test");
  };
  auto gpu = make_engine(std::string(M3_REPO_ROOT) + "/models/m3-tiny", o);
  ASSERT_FALSE(gpu.is_ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kUnimplemented) << gpu.status().message();
  EXPECT_NE(gpu.status().message().find("--enable-dp-attention --dp 2"), std::string::npos)
      << gpu.status().message();
  EXPECT_NE(gpu.status().message().find("on GPUs is not supported yet"), std::string::npos)
      << gpu.status().message();
}

// --device cuda --tp N reaches the real-shape runner's factory with the ranks, the per-rank KV
// page size and --dist-timeout; the layouts GPU ranks do not take yet are refused by name.
TEST(ServeFlags, GpuTensorParallelReachesTheCudaRunner) {
  EngineStackOptions o;
  o.device = "cuda";
  o.dummy_weights = true;  // the built-in MiniMax-M3.1-Flash config
  o.num_layers = 2;
  o.tensor_parallel = 2;
  // 10 pages of one GPU's share: 2 layers x 128 tokens x (2 of the 4 KV heads' K and V + the
  // index key) x 128 dims x 2 bytes (a whole page, 589,824 bytes, would give 5).
  const int64_t rank_page_bytes = 2 * 128 * (2 * 2 * 128 + 128) * 2;
  o.kv_cache_bytes = 10 * rank_page_bytes;
  o.nodes.dist_timeout = std::chrono::seconds(17);
  o.make_backend = [](const std::string&, int) -> Result<std::unique_ptr<Backend>> {
    return Status(StatusCode::kInternal, "the float32 backend is not used by GPU ranks");
  };
  CudaKvPoolRequest seen;
  int calls = 0;
  o.make_cuda_runner = [&](const MiniMaxM3Config& cfg, const WeightSource&,
                           const CudaKvPoolRequest& pool) -> Result<std::unique_ptr<ModelRunner>> {
    seen = pool;
    ++calls;
    EXPECT_EQ(cfg.num_attention_heads, 64) << "the factory gets the whole model's config";
    return Status(StatusCode::kUnavailable, "stop here");
  };
  auto e = make_engine("", o);
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().message(), "stop here");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen.tensor_parallel, 2);
  EXPECT_EQ(seen.dist_timeout, std::chrono::seconds(17));
  EXPECT_EQ(seen.kv_cache_bytes, 10 * rank_page_bytes);
  EXPECT_TRUE(seen.custom_all_reduce);
  auto flags = parse_serve_flags({"--disable-custom-all-reduce"});
  ASSERT_TRUE(flags.is_ok());
  auto from_flags = options_from_config(flags->config);
  ASSERT_TRUE(from_flags.is_ok());
  EXPECT_FALSE(from_flags->custom_all_reduce);
  o.custom_all_reduce = false;
  ASSERT_FALSE(make_engine("", o).is_ok());
  EXPECT_FALSE(seen.custom_all_reduce);
  EXPECT_EQ(calls, 2);
  o.custom_all_reduce = true;
  o.expert_parallel = 2;
  auto ep = make_engine("", o);
  ASSERT_FALSE(ep.is_ok());
  EXPECT_EQ(ep.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(ep.status().message().find("--ep 2"), std::string::npos) << ep.status().message();
  o.expert_parallel = 1;
  o.tensor_parallel = 8;  // 8 query heads per KV head on a rank: not the sparse kernels' shape
  auto tp8 = make_engine("", o);
  ASSERT_FALSE(tp8.is_ok());
  EXPECT_NE(tp8.status().message().find("--tp 8 --device cuda"), std::string::npos)
      << tp8.status().message();
  EXPECT_NE(tp8.status().message().find("num_attention_heads"), std::string::npos);
  EXPECT_EQ(calls, 2);
}

TEST(ServeFlags, RankLayoutFollowsSglang) {
  auto layout = [](int tp, int ep, bool all) { return resolve_rank_layout(tp, ep, all); };
  auto tp_ep = [&](int tp, int ep, bool all) {
    auto l = layout(tp, ep, all);
    EXPECT_TRUE(l.is_ok()) << l.status().message();
    return l.is_ok() ? std::pair<int, int>{l->tp, l->ep} : std::pair<int, int>{0, 0};
  };
  EXPECT_EQ(tp_ep(1, 1, false), (std::pair<int, int>{1, 1}));
  EXPECT_EQ(tp_ep(4, 1, false), (std::pair<int, int>{4, 1}));
  EXPECT_EQ(tp_ep(2, 2, false), (std::pair<int, int>{2, 2}));
  EXPECT_EQ(tp_ep(4, 2, false), (std::pair<int, int>{4, 2}));  // experts split 2 ways inside
  EXPECT_EQ(tp_ep(1, 4, false), (std::pair<int, int>{4, 4}));  // --ep alone: that many ranks
  EXPECT_EQ(tp_ep(8, 1, true), (std::pair<int, int>{8, 8}));   // vLLM's switch
  EXPECT_EQ(tp_ep(8, 8, true), (std::pair<int, int>{8, 8}));
  EXPECT_EQ(tp_ep(1, 1, true), (std::pair<int, int>{1, 1}));
  auto bad = layout(4, 3, false);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--ep 3 must divide --tp 4"), std::string::npos)
      << bad.status().message();
  auto clash = layout(8, 2, true);
  ASSERT_FALSE(clash.is_ok());
  EXPECT_NE(clash.status().message().find("--enable-expert-parallel"), std::string::npos);
  EXPECT_NE(clash.status().message().find("--ep 2"), std::string::npos);
}

}  // namespace
}  // namespace m3::app
