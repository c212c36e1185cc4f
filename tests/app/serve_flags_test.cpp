// `m3serve serve`'s flags: SGLang's names, hints for unknown flags, the hidden fake-backend flags.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "app/engine_stack.h"
#include "app/memory_plan.h"
#include "app/serve_flags.h"
#include "model/minimax_m3/cuda/dspark_cuda_plan.h"
#include "model/minimax_m3/dspark/dspark_engine_draft.h"
#include "model/minimax_m3/dummy_weights.h"

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

TEST(ServeFlags, TheLoopbackMediaFlagIsForTestsOnly) {
  unsetenv("M3SERVE_TEST_ENVIRONMENT");
  auto refused = parse_serve_flags({"--allow-loopback-media-for-tests"});
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("tests only"), std::string::npos);
  setenv("M3SERVE_TEST_ENVIRONMENT", "1", 1);
  auto f = parse_serve_flags({"--allow-loopback-media-for-tests", "--media-fetch-timeout", "0.5"});
  unsetenv("M3SERVE_TEST_ENVIRONMENT");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_TRUE(f->config.server.media.allow_loopback_for_tests);
  EXPECT_EQ(f->config.server.media.fetch_timeout, std::chrono::milliseconds(500));
  EXPECT_FALSE(parse_serve_flags({"--media-fetch-timeout", "0"}).is_ok());
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
  add(c.chunked_prefill_size); add(c.chunked_prefill_size_while_decoding);
  add(c.max_running_requests); add(c.max_queued_requests);
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
  add(c.cuda_graph_max_bs);
  s += c.speculative_draft_model_path + "|" + c.speculative_draft_load_format + "|";
  add(c.speculative_num_draft_tokens);
  add(c.speculative_simulate_accept_length);
  add(c.hicache_ratio); add(c.hicache_ratio_set); add(c.hicache_write_policy_set);
  s += c.hicache_write_policy + "|" + c.hicache_storage_backend + "|" + c.hicache_storage_dir + "|";
  add(c.server.media.fetch_timeout.count());
  add(c.server.media.allow_loopback_for_tests);
  return s;
}

// Every flag either changes the configuration or leaves a startup notice that names it: nothing
// is parsed and then dropped.
TEST(ServeFlags, EveryFlagTakesEffectOrSaysWhyNot) {
  setenv("M3SERVE_TEST_ENVIRONMENT", "1", 1);  // --allow-loopback-media-for-tests parses only here
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
                            "--cuda-graph-backend-prefill"}) {
    bool noted = false;
    for (const std::string& n : f->config.notices) noted |= n.rfind(inert, 0) == 0;
    EXPECT_TRUE(noted) << inert;
  }
  EXPECT_EQ(f->config.mem_fraction_static, 0.8) << "plans the KV pool (memory_plan.h)";
  EXPECT_EQ(f->config.cuda_graph_max_bs, 128) << "the real-shape kernels' decode-path rows";
  // --tp 4 runs (CPU ranks, or GPU ranks on the real-shape kernels), DSPARK with it (the draft
  // beside rank 0).
  auto accepted = options_from_config(f->config);
  ASSERT_TRUE(accepted.is_ok()) << accepted.status().message();
  EXPECT_EQ(accepted->tensor_parallel, 4);
  EXPECT_EQ(accepted->decode_max_rows, 128);
  EXPECT_EQ(accepted->decode_max_rows_flag, "--cuda-graph-max-bs-decode");
  EXPECT_TRUE(accepted->speculative);
  EXPECT_TRUE(accepted->speculative_options.method == VerifyMethod::kBlock);
  // And on GPU ranks (the draft beside rank 0).
  auto on_gpus = parse_serve_flags({"--speculative-algorithm", "DSPARK", "--device", "cuda", "--tp", "2"});
  ASSERT_TRUE(on_gpus.is_ok());
  auto gpu_ranks = options_from_config(on_gpus->config);
  ASSERT_TRUE(gpu_ranks.is_ok()) << gpu_ranks.status().message();
  EXPECT_TRUE(gpu_ranks->speculative);
  EXPECT_EQ(gpu_ranks->tensor_parallel, 2);
  for (auto [flags, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--dp", "2"}, "--dp 2"},
           {{"--enable-hierarchical-cache", "--device", "cuda", "--tp", "2"},
            "--enable-hierarchical-cache with --device cuda --tp/--ep"},
           {{"--enable-hierarchical-cache", "--tp", "2", "--dp", "2", "--enable-dp-attention"},
            "--enable-hierarchical-cache with --dp"}}) {
    auto g = parse_serve_flags(flags);
    ASSERT_TRUE(g.is_ok());
    auto o = options_from_config(g->config);
    ASSERT_FALSE(o.is_ok()) << named;
    EXPECT_EQ(o.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(o.status().message().find(named), std::string::npos) << o.status().message();
  }
  // HiCache: the flags reach the engine's options; each --hicache-* flag alone, and a storage
  // backend without its directory (or the reverse), is refused by name.
  {
    auto h = parse_serve_flags({"--enable-hierarchical-cache", "--hicache-size", "2",
                                "--hicache-write-policy", "write_back",
                                "--hicache-storage-backend", "file", "--hicache-storage-dir",
                                "/tmp/kv"});
    ASSERT_TRUE(h.is_ok()) << h.status().message();
    auto ho = options_from_config(h->config);
    ASSERT_TRUE(ho.is_ok()) << ho.status().message();
    EXPECT_TRUE(ho->hicache);
    EXPECT_EQ(ho->hicache_host_bytes, int64_t(2e9));
    EXPECT_EQ(ho->hicache_policy, HiCacheWritePolicy::kWriteBack);
    EXPECT_EQ(ho->hicache_disk_dir, "/tmp/kv");
    auto r = parse_serve_flags({"--enable-hierarchical-cache", "--hicache-ratio", "3"});
    ASSERT_TRUE(r.is_ok());
    auto ro = options_from_config(r->config);
    ASSERT_TRUE(ro.is_ok()) << ro.status().message();
    EXPECT_EQ(ro->hicache_host_bytes, 0);
    EXPECT_EQ(ro->hicache_ratio, 3.0);
    EXPECT_EQ(ro->hicache_policy, HiCacheWritePolicy::kWriteThrough);
    // On the GPU (the CUDA runner's page copier) and the CPU, over every KV dtype (a quantised
    // page moves with its scales).
    for (const char* device : {"cuda", "cpu"})
      for (const char* dtype : {"auto", "bf16", "fp8_e4m3", "fp4_e2m1"}) {
        auto g = parse_serve_flags({"--enable-hierarchical-cache", "--device", device,
                                    "--kv-cache-dtype", dtype});
        ASSERT_TRUE(g.is_ok());
        auto go = options_from_config(g->config);
        ASSERT_TRUE(go.is_ok()) << device << " " << dtype << ": " << go.status().message();
        EXPECT_TRUE(go->hicache);
      }
    // Over CPU ranks of one process (a page is every rank's shard).
    auto tp = parse_serve_flags({"--enable-hierarchical-cache", "--tp", "2", "--ep", "2"});
    ASSERT_TRUE(tp.is_ok());
    auto tpo = options_from_config(tp->config);
    ASSERT_TRUE(tpo.is_ok()) << tpo.status().message();
    EXPECT_TRUE(tpo->hicache);
    EXPECT_EQ(tpo->tensor_parallel, 2);
    EXPECT_FALSE(parse_serve_flags({"--hicache-write-policy", "write_through_selective"}).is_ok());
    EXPECT_FALSE(parse_serve_flags({"--hicache-storage-backend", "mooncake"}).is_ok());
    for (auto [flags, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"--hicache-size", "4"}, "--hicache-size needs --enable-hierarchical-cache"},
             {{"--hicache-ratio", "2"}, "--hicache-ratio needs --enable-hierarchical-cache"},
             {{"--hicache-storage-dir", "/tmp/kv"}, "--hicache-storage-dir needs"},
             {{"--enable-hierarchical-cache", "--hicache-storage-backend", "file"},
              "--hicache-storage-dir DIR"},
             {{"--enable-hierarchical-cache", "--hicache-storage-dir", "/tmp/kv"},
              "--hicache-storage-backend file"}}) {
      auto g = parse_serve_flags(flags);
      ASSERT_TRUE(g.is_ok()) << named;
      auto o = options_from_config(g->config);
      ASSERT_FALSE(o.is_ok()) << named;
      EXPECT_NE(o.status().message().find(named), std::string::npos) << o.status().message();
    }
  }
  // DSPARK on one GPU is accepted here (the float32 CUDA backend's draft; make_engine refuses a
  // model on the real-shape kernels by name).
  {
    auto g = parse_serve_flags({"--speculative-algorithm", "DSPARK", "--device", "cuda"});
    ASSERT_TRUE(g.is_ok());
    auto o = options_from_config(g->config);
    ASSERT_TRUE(o.is_ok()) << o.status().message();
    EXPECT_TRUE(o->speculative);
  }
  // --kv-cache-dtype takes effect on the CPU, over CPU ranks and on the GPU; auto and bf16 keep
  // the GPU's own bf16 (the real-shape kernels' auto; float32 on the float32 backend).
  for (auto [flags, want] : std::vector<std::pair<std::vector<std::string>, KvCacheDtype>>{
           {{}, KvCacheDtype::kFloat32},
           {{"--kv-cache-dtype", "auto"}, KvCacheDtype::kFloat32},
           {{"--kv-cache-dtype", "bf16"}, KvCacheDtype::kBF16},
           {{"--kv-cache-dtype", "fp8_e4m3"}, KvCacheDtype::kFp8E4M3},
           {{"--kv-cache-dtype", "fp4_e2m1", "--device", "cpu"}, KvCacheDtype::kFp4E2M1},
           {{"--kv-cache-dtype", "fp8_e4m3", "--tp", "4", "--ep", "2"}, KvCacheDtype::kFp8E4M3},
           {{"--kv-cache-dtype", "bf16", "--tp", "2", "--enable-dp-attention", "--dp", "2"},
            KvCacheDtype::kBF16},
           {{"--kv-cache-dtype", "bf16", "--device", "cuda"}, KvCacheDtype::kFloat32},
           {{"--kv-cache-dtype", "fp8_e4m3", "--device", "cuda"}, KvCacheDtype::kFp8E4M3},
           {{"--kv-cache-dtype", "fp4_e2m1", "--device", "cuda"}, KvCacheDtype::kFp4E2M1}}) {
    auto g = parse_serve_flags(flags);
    ASSERT_TRUE(g.is_ok());
    auto o = options_from_config(g->config);
    ASSERT_TRUE(o.is_ok()) << o.status().message();
    EXPECT_EQ(o->kv_cache_dtype, want) << (flags.empty() ? "" : flags[1]);
  }
  {
    auto bad = parse_serve_flags({"--kv-cache-dtype", "fp8_e5m2"});
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("--kv-cache-dtype"), std::string::npos);
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
  EXPECT_FALSE(o->draft_dummy_weights);

  // Random draft weights next to the real target (SGLang's --speculative-draft-load-format).
  auto dummy = parse_serve_flags(
      {"--speculative-algorithm", "DSPARK", "--speculative-draft-load-format", "dummy"});
  ASSERT_TRUE(dummy.is_ok()) << dummy.status().message();
  auto od = options_from_config(dummy->config);
  ASSERT_TRUE(od.is_ok()) << od.status().message();
  EXPECT_TRUE(od->draft_dummy_weights);
  EXPECT_FALSE(od->dummy_weights);
  auto bad = parse_serve_flags({"--speculative-draft-load-format", "gguf"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--speculative-draft-load-format"), std::string::npos);

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

  // Over CPU ranks the draft runs unsplit on rank 0: this process's (--tp / --ep), attention
  // data-parallel groups (each group's first rank sends its captured states to rank 0), nodes.
  for (const auto& ranks : std::vector<std::vector<std::string>>{
           {"--tp", "2"},
           {"--ep", "2"},
           {"--tp", "2", "--dp", "2", "--enable-dp-attention"},
           {"--nnodes", "2", "--dist-init-addr", "h:1"}}) {
    std::vector<std::string> args = {"--speculative-algorithm", "DSPARK"};
    args.insert(args.end(), ranks.begin(), ranks.end());
    auto g = parse_serve_flags(args);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    auto r = options_from_config(g->config);
    ASSERT_TRUE(r.is_ok()) << ranks[0] << ": " << r.status().message();
    EXPECT_TRUE(r->speculative);
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
// --chunked-prefill-size-while-decoding reaches the scheduler (at most --chunked-prefill-size);
// without it a step's prefill budget is the same whether or not anything decodes.
TEST(ServeFlags, PrefillBudgetWhileDecodingReachesTheScheduler) {
  const std::string tiny = std::string(M3_REPO_ROOT) + "/models/m3-tiny";
  auto flags = parse_serve_flags(
      {"--chunked-prefill-size", "4096", "--chunked-prefill-size-while-decoding", "32"});
  ASSERT_TRUE(flags.is_ok()) << flags.status().message();
  auto o = options_from_config(flags->config);
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  o->num_threads = 2;
  auto e = make_engine(tiny, *o);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_EQ(e->engine->scheduler().group_prefill_budget(), 4096);
  EXPECT_EQ(e->engine->scheduler().group_prefill_budget_while_decoding(), 32);
  o->chunked_prefill_size_while_decoding = 100000;  // above --chunked-prefill-size: that one
  e = make_engine(tiny, *o);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_EQ(e->engine->scheduler().group_prefill_budget_while_decoding(), 4096);
  o->chunked_prefill_size_while_decoding = 0;
  e = make_engine(tiny, *o);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_EQ(e->engine->scheduler().group_prefill_budget_while_decoding(), 4096);
  EXPECT_FALSE(parse_serve_flags({"--chunked-prefill-size-while-decoding", "0"}).is_ok());
}

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
  // On GPU ranks too (GpuDataParallelAttentionReachesTheCudaRunner), the same check first,
  // before anything loads.
  o.device = "cuda";
  o.make_backend = [](const std::string&, int) -> Result<std::unique_ptr<Backend>> {
    return internal_error("no backend in this test");
  };
  auto gpu = make_engine(std::string(M3_REPO_ROOT) + "/models/m3-tiny", o);
  ASSERT_FALSE(gpu.is_ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kInvalidArgument) << gpu.status().message();
  EXPECT_NE(gpu.status().message().find("--dp 3 must divide --tp 4"), std::string::npos)
      << gpu.status().message();
}

// A stand-in for the CUDA runner with attention groups: make_engine builds the engine over it.
class FakeGpuRanks final : public ModelRunner {
 public:
  FakeGpuRanks(int ranks, int dp, int32_t pages) : ranks_(ranks), dp_(dp), pages_(pages) {}
  int32_t vocab_size() const override { return 200064; }
  int32_t hidden_size() const override { return 6144; }
  int32_t num_kv_pages() const override { return pages_; }
  int32_t page_size() const override { return 128; }
  int32_t num_ranks() const override { return ranks_; }
  int32_t dp_groups() const override { return dp_; }
  Status forward(const ModelStep&, ModelOutput&) override {
    return internal_error("not run in this test");
  }

 private:
  int ranks_, dp_;
  int32_t pages_;
};

// --device cuda --tp T --enable-dp-attention --dp D reaches the real-shape runner's factory with
// the groups and a GPU's page of its group's pool (the KV heads split T/D ways, not T), and the
// engine is built with D groups over the runner's pools; the report names the layout. A GPU's heads
// are its group's share: under --tp 8 --dp 2 it holds 16 query heads over one KV head (its group
// of 4's share), the sparse kernels' shape, where --tp 8 alone gives it 8 and is refused. (The
// two layers of the built-in config here are dense; M3.1-Flash's MoE layers, 3072 / 8 = 384 wide
// at --tp 8, do not fit the kernels whatever --dp.)
TEST(ServeFlags, GpuDataParallelAttentionReachesTheCudaRunner) {
  EngineStackOptions o;
  o.device = "cuda";
  o.dummy_weights = true;  // the built-in MiniMax-M3.1-Flash config (64 query, 4 KV heads)
  o.num_layers = 2;
  o.tensor_parallel = 4;
  o.dp_attention = 2;
  // A GPU of a group of 2: 2 of the 4 KV heads, as under --tp 2.
  const int64_t group_of_2_page = 2 * 128 * (2 * 2 * 128 + 128) * 2;
  o.kv_cache_bytes = 10 * group_of_2_page;
  o.make_backend = [](const std::string&, int) -> Result<std::unique_ptr<Backend>> {
    return Status(StatusCode::kInternal, "the float32 backend is not used by GPU ranks");
  };
  CudaKvPoolRequest seen;
  int calls = 0;
  bool build = false;
  o.make_cuda_runner = [&](const MiniMaxM3Config& cfg, const WeightSource&,
                           const CudaKvPoolRequest& pool) -> Result<std::unique_ptr<ModelRunner>> {
    seen = pool;
    ++calls;
    EXPECT_EQ(cfg.num_attention_heads, 64) << "the factory gets the whole model's config";
    if (!build) return Status(StatusCode::kUnavailable, "stop here");
    return std::unique_ptr<ModelRunner>(std::make_unique<FakeGpuRanks>(
        pool.tensor_parallel, pool.dp_attention,
        static_cast<int32_t>(pool.kv_cache_bytes / group_of_2_page)));
  };
  auto tp4 = make_engine("", o);
  ASSERT_FALSE(tp4.is_ok());
  EXPECT_EQ(tp4.status().message(), "stop here");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen.tensor_parallel, 4);
  EXPECT_EQ(seen.dp_attention, 2);
  EXPECT_EQ(seen.expert_parallel, 1);
  EXPECT_EQ(seen.kv_cache_bytes, 10 * group_of_2_page);
  // From the flags, as m3serve serve parses them.
  auto flags = parse_serve_flags(
      {"--device", "cuda", "--tp", "4", "--enable-dp-attention", "--dp", "2"});
  ASSERT_TRUE(flags.is_ok()) << flags.status().message();
  auto from_flags = options_from_config(flags->config);
  ASSERT_TRUE(from_flags.is_ok()) << from_flags.status().message();
  EXPECT_EQ(from_flags->device, "cuda");
  EXPECT_EQ(from_flags->tensor_parallel, 4);
  EXPECT_EQ(from_flags->dp_attention, 2);
  // The engine over the runner: two groups, each with the runner's pages.
  build = true;
  auto e = make_engine("", o);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_EQ(e->engine->scheduler().num_dp_groups(), 2);
  bool layout = false, per_group = false;
  for (const std::string& line : e->report) {
    layout |= line.find("(tp 4, dp 2, ep 1)") != std::string::npos &&
              line.find("2 attention groups of 2 GPUs") != std::string::npos;
    // 10 pages: the bytes given over a GPU's page of its group's pool.
    per_group |= line.find("per DP group (2 groups)") != std::string::npos &&
                 line.find("; 10 pages of 128 tokens") != std::string::npos;
  }
  EXPECT_TRUE(layout);
  EXPECT_TRUE(per_group);
  build = false;
  // --tp 8 --dp 2: groups of 4, one KV head per GPU (16 query heads on it): the kernels' shape.
  o.tensor_parallel = 8;
  o.dp_attention = 1;  // --tp 8 alone: 8 query heads per KV head, refused naming the field
  auto tp8_alone = make_engine("", o);
  ASSERT_FALSE(tp8_alone.is_ok());
  EXPECT_NE(tp8_alone.status().message().find("num_attention_heads"), std::string::npos)
      << tp8_alone.status().message();
  EXPECT_EQ(calls, 2);
  o.dp_attention = 2;
  o.kv_cache_bytes = 10 * (2 * 128 * (2 * 1 * 128 + 128) * 2);
  auto tp8 = make_engine("", o);
  ASSERT_FALSE(tp8.is_ok());
  EXPECT_EQ(tp8.status().message(), "stop here");
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(seen.tensor_parallel, 8);
  EXPECT_EQ(seen.dp_attention, 2);
  EXPECT_EQ(seen.kv_cache_bytes, 10 * (2 * 128 * (2 * 1 * 128 + 128) * 2));
  // --tp 2 --dp 2: groups of one GPU, each with all the heads (a whole page per GPU).
  o.tensor_parallel = 2;
  o.kv_cache_bytes = 10 * (2 * 128 * (2 * 4 * 128 + 128) * 2);
  ASSERT_FALSE(make_engine("", o).is_ok());
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(seen.tensor_parallel, 2);
  EXPECT_EQ(seen.dp_attention, 2);
  // A --dp that does not divide --tp is refused by name, the factory not called.
  o.tensor_parallel = 4;
  o.dp_attention = 3;
  auto bad = make_engine("", o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().message();
  EXPECT_NE(bad.status().message().find("--dp 3"), std::string::npos) << bad.status().message();
  EXPECT_EQ(calls, 4);
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
  // Every GPU its vocabulary slice of the embedding and head (rank 0 the whole tables only for a
  // GPU draft beside it: below).
  EXPECT_FALSE(seen.whole_vocab_on_rank0);
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
  o.expert_parallel = 1;
  o.tensor_parallel = 8;  // 8 query heads per KV head on a rank: not the sparse kernels' shape
  auto tp8 = make_engine("", o);
  ASSERT_FALSE(tp8.is_ok());
  EXPECT_NE(tp8.status().message().find("--tp 8 --device cuda"), std::string::npos)
      << tp8.status().message();
  EXPECT_NE(tp8.status().message().find("num_attention_heads"), std::string::npos);
  EXPECT_EQ(calls, 2);
  o.tensor_parallel = 2;
  o.speculative = true;
  ASSERT_FALSE(make_engine("", o).is_ok());
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(seen.whole_vocab_on_rank0);
}

// On the real-shape path the KV pool leaves room for the GPU draft beside it (its MXFP8 weights,
// a context per running request and a propose's scratch, dspark_cuda_plan.h): planned from the
// same measured memory, the pool with --speculative-algorithm is smaller by those bytes.
TEST(ServeFlags, TheGpuDraftIsKeptOutOfTheKvPool) {
  auto planned_pool = [](bool speculative) -> int64_t {
    EngineStackOptions o;
    o.device = "cuda";
    o.dummy_weights = true;  // the built-in MiniMax-M3.1-Flash config, a dummy draft
    o.num_layers = 2;
    o.mem_fraction_static = 0.8;
    o.max_running_requests = 4;
    o.speculative = speculative;
    o.make_backend = [](const std::string&, int) -> Result<std::unique_ptr<Backend>> {
      return Status(StatusCode::kInternal, "unused");
    };
    int64_t pool_bytes = -1;
    o.make_cuda_runner = [&](const MiniMaxM3Config&, const WeightSource&,
                             const CudaKvPoolRequest& pool) -> Result<std::unique_ptr<ModelRunner>> {
      auto b = pool.plan_pool_bytes(MeasuredMemory{80'000'000'000, 10'000'000'000,
                                                   2'000'000'000, 60'000'000'000});
      EXPECT_TRUE(b.is_ok()) << b.status().to_string();
      pool_bytes = b.is_ok() ? *b : -1;
      return Status(StatusCode::kUnavailable, "stop here");
    };
    auto e = make_engine("", o);
    EXPECT_FALSE(e.is_ok());
    return pool_bytes;
  };
  const int64_t plain = planned_pool(false), with_draft = planned_pool(true);
  ASSERT_GT(plain, 0);
  ASSERT_GT(with_draft, 0);
  const MiniMaxM3Config target = minimax_m3::builtin_m3_flash_config(2);
  minimax_m3::dspark::DSparkConfig draft = minimax_m3::dspark::default_dspark_config_for(target);
  ASSERT_TRUE(draft.resolve_with_target(target).is_ok());
  auto dp = minimax_m3::plan_dspark_cuda(draft);
  ASSERT_TRUE(dp.is_ok()) << dp.status().to_string();
  const int64_t kept = dp->weight_bytes + 4 * dp->kv_bytes_per_sequence + dp->propose_scratch_bytes;
  // The pool is whole pages: within one page of the draft's bytes.
  const int64_t page = 2 * 128 * (2 * 4 * 128 + 128) * 2;
  EXPECT_NEAR(double(plain - with_draft), double(kept), double(page));
}

// --device cuda --ep N reaches the real-shape runner's factory with the expert-parallel ranks
// (--ep 2 alone: two ranks, as on CPU ranks; --tp 4 --ep 2 as given), the same per-rank KV page
// as --tp alone (attention stays split over every rank); an --ep that does not divide --tp, or
// experts that do not split, are refused naming the flags before anything loads.
TEST(ServeFlags, GpuExpertParallelReachesTheCudaRunner) {
  EngineStackOptions o;
  o.device = "cuda";
  o.dummy_weights = true;  // the built-in MiniMax-M3.1-Flash config (128 experts)
  o.num_layers = 2;
  o.expert_parallel = 2;
  const int64_t rank_page_bytes = 2 * 128 * (2 * 2 * 128 + 128) * 2;  // as under --tp 2
  o.kv_cache_bytes = 10 * rank_page_bytes;
  o.make_backend = [](const std::string&, int) -> Result<std::unique_ptr<Backend>> {
    return Status(StatusCode::kInternal, "the float32 backend is not used by GPU ranks");
  };
  CudaKvPoolRequest seen;
  int calls = 0;
  o.make_cuda_runner = [&](const MiniMaxM3Config& cfg, const WeightSource&,
                           const CudaKvPoolRequest& pool) -> Result<std::unique_ptr<ModelRunner>> {
    seen = pool;
    ++calls;
    EXPECT_EQ(cfg.num_local_experts, 128) << "the factory gets the whole model's config";
    return Status(StatusCode::kUnavailable, "stop here");
  };
  auto ep2 = make_engine("", o);
  ASSERT_FALSE(ep2.is_ok());
  EXPECT_EQ(ep2.status().message(), "stop here");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen.tensor_parallel, 2);
  EXPECT_EQ(seen.expert_parallel, 2);
  EXPECT_EQ(seen.kv_cache_bytes, 10 * rank_page_bytes);
  // From the flags, as m3serve serve parses them.
  auto flags = parse_serve_flags({"--device", "cuda", "--ep", "2"});
  ASSERT_TRUE(flags.is_ok()) << flags.status().message();
  auto from_flags = options_from_config(flags->config);
  ASSERT_TRUE(from_flags.is_ok()) << from_flags.status().message();
  EXPECT_EQ(from_flags->device, "cuda");
  EXPECT_EQ(from_flags->expert_parallel, 2);
  // --tp 4 --ep 2: four GPUs, two expert-parallel ranks. (The built-in config's 4 KV heads
  // under --tp 4 give one per rank: 16 query heads per KV head, the sparse kernels' shape.)
  o.tensor_parallel = 4;
  o.kv_cache_bytes = 10 * (2 * 128 * (2 * 1 * 128 + 128) * 2);
  auto tp4 = make_engine("", o);
  ASSERT_FALSE(tp4.is_ok());
  EXPECT_EQ(tp4.status().message(), "stop here");
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seen.tensor_parallel, 4);
  EXPECT_EQ(seen.expert_parallel, 2);
  // vLLM's switch on GPUs: the experts over all --tp ranks.
  o.expert_parallel = 1;
  o.enable_expert_parallel = true;
  ASSERT_FALSE(make_engine("", o).is_ok());
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(seen.expert_parallel, 4);
  o.enable_expert_parallel = false;
  // --ep 3 does not divide --tp 4: refused by name, the factory not called.
  o.expert_parallel = 3;
  auto bad = make_engine("", o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().message();
  EXPECT_NE(bad.status().message().find("--ep 3"), std::string::npos) << bad.status().message();
  EXPECT_EQ(calls, 3);
  // With data-parallel attention (--tp 4 --ep 2 --dp 2): the groups and the experts both reach
  // it, a GPU's page its group of 2's share (2 KV heads).
  o.expert_parallel = 2;
  o.dp_attention = 2;
  o.kv_cache_bytes = 10 * rank_page_bytes;
  auto dp = make_engine("", o);
  ASSERT_FALSE(dp.is_ok());
  EXPECT_EQ(dp.status().message(), "stop here");
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(seen.tensor_parallel, 4);
  EXPECT_EQ(seen.expert_parallel, 2);
  EXPECT_EQ(seen.dp_attention, 2);
  EXPECT_EQ(seen.kv_cache_bytes, 10 * rank_page_bytes);
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


// --speculative-algorithm DSPARK without --speculative-draft-model-path loads the model
// directory's dspark/ folder (the deployment guide's layout); here a temporary model directory
// (m3-tiny's files) whose dspark/config.json asks for a one-layer draft, with random draft
// weights (--speculative-draft-load-format dummy) since no trained draft exists for m3-tiny.
TEST(ServeFlags, DSparkDraftFromTheModelDirectorysDsparkFolder) {
  namespace fs = std::filesystem;
  const fs::path tiny = fs::path(M3_REPO_ROOT) / "models" / "m3-tiny";
  const fs::path dir = fs::temp_directory_path() /
                       ("m3serve-dspark-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "dspark");
  for (const auto& e : fs::directory_iterator(tiny)) {
    // The model's own draft (m3-tiny ships one) is replaced by the one-layer draft below.
    if (e.path().filename() == "dspark") continue;
    fs::create_symlink(e.path(), dir / e.path().filename());
  }
  {
    std::ofstream cfg(dir / "dspark" / "config.json");
    cfg << R"({"architectures": ["DSparkMiniMaxDraftModel"], "num_hidden_layers": 1,
      "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
      "vocab_size": 4096, "dspark_ffn_hidden_size": 512, "sliding_window": 512,
      "layer_types": ["sliding_attention"], "dspark_block_size": 4, "dspark_noise_token_id": 4090,
      "dspark_target_layer_ids": [1, 3, 5], "dspark_markov_rank": 32})";
  }
  DraftMemoryShape one_layer;
  one_layer.hidden = 256, one_layer.layers = 1, one_layer.heads = 8, one_layer.kv_heads = 2;
  one_layer.head_dim = 32, one_layer.intermediate = 512, one_layer.vocab = 4096;
  one_layer.markov_rank = 32, one_layer.sliding_window = 512, one_layer.num_target_layers = 3;
  one_layer.confidence_head = true, one_layer.confidence_with_markov = true;
  EngineStackOptions o;
  o.num_threads = 2;
  o.kv_cache_bytes = 16 << 20;
  o.speculative = true;
  o.draft_dummy_weights = true;
  for (int tp : {1, 2}) {
    o.tensor_parallel = tp;
    auto e = make_engine(dir.string(), o);
    ASSERT_TRUE(e.is_ok()) << "tp " << tp << ": " << e.status().message();
    EXPECT_TRUE(e->engine->speculative());
    bool named = false, draft = false;
    const std::string weights = "draft memory: DSpark weights " +
                                format_bytes(draft_weight_bytes(one_layer)) + " (float32)";
    for (const std::string& line : e->report) {
      named |= line.find(weights) != std::string::npos;
      draft |= line.find("speculative decoding: DSpark draft, block 4, 5 tokens") != std::string::npos;
    }
    EXPECT_TRUE(named) << "tp " << tp << ": no report line with '" << weights << "'";
    EXPECT_TRUE(draft) << "tp " << tp << ": the draft's block size is its config's";
  }
  // The folder has no weights: without dummy draft weights the error names the directory.
  o.tensor_parallel = 1;
  o.draft_dummy_weights = false;
  auto missing = make_engine(dir.string(), o);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("--speculative-draft-model-path '" +
                                            (dir / "dspark").string() + "'"),
            std::string::npos)
      << missing.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace m3::app
