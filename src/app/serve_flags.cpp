#include "app/serve_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <string_view>

#include "chat/parsers/output_parser.h"
#include "sched/scheduler.h"
#include "server/fake/fake_flags.h"

namespace m3::app {

namespace {

enum class FlagGroup { kModel, kParallel, kMemory, kScheduling, kSpeculative, kServer, kSecurity };

const char* group_title(FlagGroup g) {
  switch (g) {
    case FlagGroup::kModel: return "model";
    case FlagGroup::kParallel: return "devices and parallelism";
    case FlagGroup::kMemory: return "memory";
    case FlagGroup::kScheduling: return "scheduling";
    case FlagGroup::kSpeculative: return "speculative decoding";
    case FlagGroup::kServer: return "server";
    case FlagGroup::kSecurity: return "security and limits";
  }
  return "";
}

struct Flag {
  const char* name;
  bool takes_value;
  FlagGroup group;
  const char* help;     // what m3serve does with it; nullptr: an alias, listed under its name
  const char* example;  // a valid value other than the default (the flag-table test uses it)
  std::function<Status(ServeConfig&, const std::string&)> set;
};

Result<int64_t> to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used != v.size() || x < lo || x > hi) throw std::out_of_range("");
    return static_cast<int64_t>(x);
  } catch (const std::exception&) {
    return invalid_argument(flag + " expects an integer in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]; got '" + v + "'");
  }
}

Result<double> to_double(const std::string& flag, const std::string& v, double lo, double hi) {
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used != v.size() || !(x >= lo && x <= hi)) throw std::out_of_range("");
    return x;
  } catch (const std::exception&) {
    return invalid_argument(flag + " expects a number in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]; got '" + v + "'");
  }
}

#define INT_FLAG(field, lo, hi)                       \
  [](ServeConfig& f, const std::string& v) -> Status { \
    auto r = to_int(current_flag(), v, lo, hi);       \
    if (!r.is_ok()) return r.status();                \
    f.field = static_cast<decltype(f.field)>(*r);     \
    return Status::ok();                              \
  }

thread_local std::string g_current_flag;
const std::string& current_flag() {
  return g_current_flag;
}

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(',', start);
    std::string item = v.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!item.empty()) out.push_back(item);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// What the setters of inert flags say at startup: the flag, its value, and why it changes nothing.
Status note(ServeConfig& f, const std::string& flag, const std::string& value,
            const std::string& why) {
  f.notices.push_back(flag + (value.empty() ? "" : " " + value) + ": " + why);
  return Status::ok();
}

Status set_double(double& out, const std::string& flag, const std::string& v, double lo,
                  double hi) {
  auto r = to_double(flag, v, lo, hi);
  if (!r.is_ok()) return r.status();
  out = *r;
  return Status::ok();
}

Status set_seconds(std::chrono::milliseconds& out, const std::string& flag,
                   const std::string& v, double lo, double hi) {
  double seconds = 0;
  M3_RETURN_IF_ERROR(set_double(seconds, flag, v, lo, hi));
  out = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  return Status::ok();
}

Status set_choice(std::string& out, const std::string& flag, const std::string& v,
                  std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (v == a) {
      out = v;
      return Status::ok();
    }
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  return invalid_argument(flag + ": '" + v + "'; allowed: " + list);
}

const std::vector<Flag>& flags() {
  using G = FlagGroup;
  // --cuda-graph-max-bs and its -decode spelling; the spelling given is kept for the startup note.
  const auto set_decode_rows = [](ServeConfig& f, const std::string& v) -> Status {
    auto r = to_int(current_flag(), v, 1, 1024);
    if (!r.is_ok()) return r.status();
    f.cuda_graph_max_bs = static_cast<int32_t>(*r);
    f.cuda_graph_max_bs_flag = current_flag();
    return Status::ok();
  };
  static const std::vector<Flag> kFlags = {
      // ---- model
      {"--model-path", true, G::kModel,
       "checkpoint directory, or a Hugging Face repo id (ORG/NAME) resolved offline in the hub "
       "cache (default: the bundled models/m3-tiny)",
       "MiniMaxAI/MiniMax-M3.1-Flash",
       [](ServeConfig& f, const std::string& v) {
         f.model_path = v;
         return Status::ok();
       }},
      {"--revision", true, G::kModel,
       "with a repo id: a commit hash, a unique prefix of one, or a ref (default: main)", "main",
       [](ServeConfig& f, const std::string& v) {
         f.revision = v;
         return Status::ok();
       }},
      {"--load-format", true, G::kModel, "auto, safetensors or dummy (random weights)", "dummy",
       [](ServeConfig& f, const std::string& v) {
         return set_choice(f.load_format, "--load-format", v, {"auto", "safetensors", "dummy"});
       }},
      {"--trust-remote-code", false, G::kModel,
       "accepted; MiniMax-M3's code is built in (no Python code is run)", "",
       [](ServeConfig& f, const std::string&) {
         return note(f, "--trust-remote-code", "",
                     "MiniMax-M3's model code is built into m3serve; no checkpoint code is run");
       }},
      {"--served-model-name", true, G::kModel,
       "model name(s) reported and accepted, comma-separated (default: --model-path as given)",
       "m3,alias",
       [](ServeConfig& f, const std::string& v) {
         f.server.served_model_names = split_list(v);
         return Status::ok();
       }},
      {"--reasoning-parser", true, G::kModel, "minimax-m3 (default) or none", "none",
       [](ServeConfig& f, const std::string& v) {
         if (!chat::is_known_reasoning_parser(v))
           return invalid_argument("--reasoning-parser: unknown parser '" + v +
                                   "'; available: minimax-m3, none");
         f.server.reasoning_parser = v;
         return Status::ok();
       }},
      {"--tool-call-parser", true, G::kModel, "minimax-m3 (default) or none", "none",
       [](ServeConfig& f, const std::string& v) {
         if (!chat::is_known_tool_parser(v))
           return invalid_argument("--tool-call-parser: unknown parser '" + v +
                                   "'; available: minimax-m3, none");
         f.server.tool_call_parser = v;
         return Status::ok();
       }},
      {"--context-length", true, G::kModel,
       "maximum prompt + completion tokens per request (also --max-model-len)", "32768",
       INT_FLAG(server.context_length, 1, INT32_MAX)},
      {"--max-model-len", true, G::kModel, nullptr, "32768",
       INT_FLAG(server.context_length, 1, INT32_MAX)},
      // ---- parallelism
      {"--device", true, G::kParallel, "auto (default: CUDA when available, else CPU), cuda or cpu",
       "cpu",
       [](ServeConfig& f, const std::string& v) {
         return set_choice(f.device, "--device", v, {"auto", "cuda", "cpu"});
       }},
      {"--tp", true, G::kParallel,
       "tensor-parallel ranks (also --tp-size, --tensor-parallel-size): GPUs 0..N-1 over NCCL "
       "with --device cuda, CPU ranks in this process with --device cpu", "2",
       INT_FLAG(tp, 1, 64)},
      {"--tp-size", true, G::kParallel, nullptr, "2", INT_FLAG(tp, 1, 64)},
      {"--tensor-parallel-size", true, G::kParallel, nullptr, "2", INT_FLAG(tp, 1, 64)},
      {"--dp", true, G::kParallel,
       "attention data-parallel groups (also --dp-size), with --enable-dp-attention; divides --tp",
       "2", INT_FLAG(dp, 1, 64)},
      {"--dp-size", true, G::kParallel, nullptr, "2", INT_FLAG(dp, 1, 64)},
      {"--disable-custom-all-reduce", false, G::kParallel,
       "GPU ranks: every all-reduce through NCCL (default: the decode step's small ones through "
       "the one-shot all-reduce over peer memory)", "",
       [](ServeConfig& f, const std::string&) {
         f.disable_custom_all_reduce = true;
         return Status::ok();
       }},
      {"--enable-dp-attention", false, G::kParallel, "attention data-parallel over --dp ranks", "",
       [](ServeConfig& f, const std::string&) {
         f.enable_dp_attention = true;
         return Status::ok();
       }},
      {"--load-balance-method", true, G::kParallel,
       "DP group a request goes to with --enable-dp-attention: round_robin (default), "
       "minimum_tokens or shortest_queue", "minimum_tokens",
       [](ServeConfig& f, const std::string& v) {
         M3_RETURN_IF_ERROR(parse_load_balance_method(v).status());
         f.load_balance_method = v;
         return Status::ok();
       }},
      {"--ep", true, G::kParallel,
       "expert-parallel ranks among the --tp ranks (also --ep-size; divides --tp; alone: --tp N): "
       "routed experts placed whole (CPU ranks: tokens moved by all-to-all; GPU ranks: each "
       "runs its experts on every token, summed by the all-reduce)",
       "2", INT_FLAG(ep, 1, 64)},
      {"--ep-size", true, G::kParallel, nullptr, "2", INT_FLAG(ep, 1, 64)},
      {"--enable-expert-parallel", false, G::kParallel,
       "vLLM's switch: routed experts placed whole over the tensor-parallel ranks (--ep = --tp)",
       "",
       [](ServeConfig& f, const std::string&) {
         f.enable_expert_parallel = true;
         return Status::ok();
       }},
      {"--nnodes", true, G::kParallel,
       "processes (nodes) the --tp ranks are spread over; node 0 serves HTTP; CPU or GPU ranks",
       "2", INT_FLAG(nnodes, 1, 64)},
      {"--node-rank", true, G::kParallel,
       "this process's node, 0 .. --nnodes - 1 (nodes other than 0 serve no HTTP)", "1",
       INT_FLAG(node_rank, 0, 63)},
      {"--dist-init-addr", true, G::kParallel,
       "HOST:PORT where node 0 serves the rendezvous the nodes join through", "127.0.0.1:5000",
       [](ServeConfig& f, const std::string& v) {
         f.dist_init_addr = v;
         return Status::ok();
       }},
      {"--dist-timeout", true, G::kParallel,
       "seconds a rendezvous or a collective may take before the group counts as broken: the "
       "step's requests fail with 503 and the process exits non-zero (default 300)", "60",
       INT_FLAG(dist_timeout_s, 1, 86400)},
      {"--moe-runner-backend", true, G::kParallel,
       "accepted; m3serve's own NVFP4 / MXFP8 MoE kernels are always used",
       "flashinfer_trtllm_routed",
       [](ServeConfig& f, const std::string& v) {
         return note(f, "--moe-runner-backend", v,
                     "m3serve runs its own NVFP4 / MXFP8 MoE kernels; there is no other MoE "
                     "runner to choose");
       }},
      {"--cuda-graph-backend-prefill", true, G::kParallel,
       "accepted; prefill runs without CUDA graphs", "breakable",
       [](ServeConfig& f, const std::string& v) {
         return note(f, "--cuda-graph-backend-prefill", v,
                     "prefill runs without CUDA graphs (decode steps are captured)");
       }},
      {"--cuda-graph-max-bs", true, G::kParallel,
       "GPU: the most rows a step runs on the decode path (GEMV kernels, captured as CUDA graphs "
       "per power-of-two batch bucket); larger steps take the prefill path (default 256)",
       "256", set_decode_rows},
      {"--cuda-graph-max-bs-decode", true, G::kParallel, "the same as --cuda-graph-max-bs",
       "256", set_decode_rows},
      // ---- memory
      {"--mem-fraction-static", true, G::kMemory,
       "weights + KV pool at most this fraction of each device's memory (GPU: its total, "
       "default 0.85; CPU: the available memory, default: a 512 MiB pool); the pool gets what "
       "the weights and the step's working memory leave (docs/memory.md)",
       "0.85",
       [](ServeConfig& f, const std::string& v) {
         return set_double(f.mem_fraction_static, "--mem-fraction-static", v, 0.0, 1.0);
       }},
      {"--gpu-memory-utilization", true, G::kMemory, nullptr, "0.85",
       [](ServeConfig& f, const std::string& v) {
         return set_double(f.mem_fraction_static, "--gpu-memory-utilization", v, 0.0, 1.0);
       }},
      {"--kv-cache-bytes", true, G::kMemory,
       "KV cache pool in bytes per device, instead of planning it by --mem-fraction-static; "
       "must hold one request of the context length",
       "1048576", INT_FLAG(kv_cache_bytes, 1, INT64_MAX)},
      {"--kv-cache-dtype", true, G::kMemory, "KV cache storage: auto (default: float32 on the CPU, bf16 on the GPU), bf16, fp8_e4m3 or "
       "fp4_e2m1 (NVFP4); the last three on the CPU (also over CPU ranks), refused on the GPU so far",
       "fp8_e4m3",
       [](ServeConfig& f, const std::string& v) {
         return set_choice(f.kv_cache_dtype, "--kv-cache-dtype", v,
                           {"auto", "bf16", "fp8_e4m3", "fp4_e2m1"});
       }},
      {"--block-size", true, G::kMemory,
       "vLLM's KV block size: accepted as 128; KV pages are the model's 128-token sparse blocks",
       "128",
       [](ServeConfig& f, const std::string& v) {
         auto r = to_int("--block-size", v, 1, 1 << 20);
         if (!r.is_ok()) return r.status();
         if (*r != 128) {
           return invalid_argument("--block-size " + v +
                                   ": KV pages are the model's 128-token sparse-attention blocks; "
                                   "only 128 is possible");
         }
         return note(f, "--block-size", v, "KV pages are the model's sparse-attention blocks");
       }},
      {"--enable-hierarchical-cache", false, G::kMemory,
       "host-memory (and disk) KV tier behind the prefix cache (CPU or GPU; one attention group on one node)", "",
       [](ServeConfig& f, const std::string&) {
         f.enable_hierarchical_cache = true;
         return Status::ok();
       }},
      {"--hicache-size", true, G::kMemory,
       "host KV tier size in GB (overrides --hicache-ratio; default 0 = use the ratio)", "64",
       [](ServeConfig& f, const std::string& v) {
         return set_double(f.hicache_size_gb, "--hicache-size", v, 0.0, 1e6);
       }},
      {"--hicache-ratio", true, G::kMemory,
       "host KV tier pages = device KV pages x this (default 2.0)", "2",
       [](ServeConfig& f, const std::string& v) {
         f.hicache_ratio_set = true;
         return set_double(f.hicache_ratio, "--hicache-ratio", v, 0.0, 1e6);
       }},
      {"--hicache-write-policy", true, G::kMemory,
       "write_through (copy to host when cached, default) or write_back (copy on eviction)",
       "write_back",
       [](ServeConfig& f, const std::string& v) {
         f.hicache_write_policy_set = true;
         return set_choice(f.hicache_write_policy, "--hicache-write-policy", v,
                           {"write_through", "write_back"});
       }},
      {"--hicache-storage-backend", true, G::kMemory,
       "file: a disk KV tier below the host tier (needs --hicache-storage-dir)", "file",
       [](ServeConfig& f, const std::string& v) {
         return set_choice(f.hicache_storage_backend, "--hicache-storage-backend", v, {"file"});
       }},
      {"--hicache-storage-dir", true, G::kMemory,
       "directory of the file storage backend's KV pages (kept across restarts)", "/var/cache/kv",
       [](ServeConfig& f, const std::string& v) {
         if (v.empty()) return invalid_argument("--hicache-storage-dir: empty directory");
         f.hicache_storage_dir = v;
         return Status::ok();
       }},
      // ---- scheduling
      {"--chunked-prefill-size", true, G::kScheduling, "prefill tokens per step (default 8192)",
       "4096", INT_FLAG(chunked_prefill_size, -1, INT32_MAX)},
      {"--chunked-prefill-size-while-decoding", true, G::kScheduling,
       "prefill tokens per step while requests decode (default: --chunked-prefill-size); small "
       "values keep their inter-token latency near idle as long prompts arrive",
       "32", INT_FLAG(chunked_prefill_size_while_decoding, 1, INT32_MAX)},
      {"--max-running-requests", true, G::kScheduling, "requests decoded together", "64",
       INT_FLAG(max_running_requests, 1, INT32_MAX)},
      {"--max-queued-requests", true, G::kScheduling, "waiting requests before 429 (default 4096)",
       "100", INT_FLAG(max_queued_requests, 1, INT32_MAX)},
      {"--tokenizer-worker-num", true, G::kScheduling,
       "request preprocessing threads: parse, render, tokenize (default 2)", "8",
       INT_FLAG(server.worker_threads, 1, 256)},
      // ---- speculative
      {"--speculative-algorithm", true, G::kSpeculative,
       "DSPARK: speculative decoding with the model's DSpark draft (CPU, --tp 1)", "DSPARK",
       [](ServeConfig& f, const std::string& v) {
         return set_choice(f.speculative_algorithm, "--speculative-algorithm", v, {"DSPARK"});
       }},
      {"--speculative-draft-model-path", true, G::kSpeculative,
       "the draft's directory (default <model>/dspark)", "/models/m3/dspark",
       [](ServeConfig& f, const std::string& v) {
         if (v.empty()) return invalid_argument("--speculative-draft-model-path: empty path");
         f.speculative_draft_model_path = v;
         return Status::ok();
       }},
      {"--speculative-draft-load-format", true, G::kSpeculative,
       "auto (the draft's checkpoint) or dummy (random draft weights, real target)", "dummy",
       [](ServeConfig& f, const std::string& v) {
         return set_choice(f.speculative_draft_load_format, "--speculative-draft-load-format", v,
                           {"auto", "dummy"});
       }},
      {"--speculative-num-draft-tokens", true, G::kSpeculative,
       "tokens per verify: the last token + drafts (default the draft's block size + 1)", "4",
       INT_FLAG(speculative_num_draft_tokens, 2, 1024)},
      {"--speculative-use-block-verification", false, G::kSpeculative,
       "block verification of the draft (with --speculative-algorithm)", "",
       [](ServeConfig& f, const std::string&) {
         f.speculative_block_verification = true;
         return Status::ok();
       }},
      {"--speculative-simulate-accept-length", true, G::kSpeculative,
       "benchmarks: commit exactly L tokens per verify (with --load-format dummy; output is not "
       "the model's)",
       "3", INT_FLAG(speculative_simulate_accept_length, 1, 1024)},
      // ---- server
      {"--host", true, G::kServer, "address to listen on (default 0.0.0.0)", "127.0.0.1",
       [](ServeConfig& f, const std::string& v) {
         f.server.host = v;
         return Status::ok();
       }},
      {"--port", true, G::kServer, "port (default 30000; 0 picks a free one)", "8000",
       INT_FLAG(server.port, 0, 65535)},
      {"--http-threads", true, G::kServer, "HTTP I/O threads (default 4)", "2",
       INT_FLAG(server.io_threads, 1, 256)},
      {"--drain-timeout", true, G::kServer, "seconds in-flight requests get on SIGTERM (default 30)",
       "5",
       [](ServeConfig& f, const std::string& v) {
         return set_seconds(f.server.drain_timeout, "--drain-timeout", v, 0.0, 86400.0);
       }},
      {"--enable-metrics", false, G::kServer, "accepted; /metrics is always on", "",
       [](ServeConfig& f, const std::string&) {
         return note(f, "--enable-metrics", "", "/metrics is always on");
       }},
      // ---- security
      {"--api-key", true, G::kSecurity,
       "require 'Authorization: Bearer <key>' on every route but /health", "sk-1",
       [](ServeConfig& f, const std::string& v) {
         f.server.api_key = v;
         return Status::ok();
       }},
      {"--allowed-media-domains", true, G::kSecurity,
       "hosts allowed in remote image URLs, comma-separated", "a.com",
       [](ServeConfig& f, const std::string& v) {
         f.server.media.allowed_domains = split_list(v);
         return Status::ok();
       }},
      {"--max-image-bytes", true, G::kSecurity, "largest accepted image (default 20 MiB)", "1000",
       INT_FLAG(server.media.max_image_bytes, 1, INT64_MAX)},
      {"--media-fetch-timeout", true, G::kSecurity,
       "seconds a remote image fetch may take, redirects included (default 5)", "2.5",
       [](ServeConfig& f, const std::string& v) {
         return set_seconds(f.server.media.fetch_timeout, "--media-fetch-timeout", v, 0.05,
                            600.0);
       }},
      {"--allow-loopback-media-for-tests", false, G::kSecurity,
       "let remote image URLs reach 127.0.0.1 (tests only: refused unless the environment has "
       "M3SERVE_TEST_ENVIRONMENT=1)",
       "",
       [](ServeConfig& f, const std::string&) {
         const char* env = std::getenv("M3SERVE_TEST_ENVIRONMENT");
         if (!env || std::string(env) != "1") {
           return invalid_argument(
               "--allow-loopback-media-for-tests is for tests only: it lets image URLs reach "
               "this machine's loopback services; set M3SERVE_TEST_ENVIRONMENT=1 in a test");
         }
         f.server.media.allow_loopback_for_tests = true;
         return Status::ok();
       }},
      {"--max-image-pixels", true, G::kSecurity,
       "largest accepted image in pixels (width x height, checked from the header before "
       "decoding; default 89478485, PIL's limit)",
       "1000000", INT_FLAG(server.media.max_image_pixels, 1, INT64_MAX)},
      {"--max-request-body-bytes", true, G::kSecurity,
       "largest request body, else 413 (default 64 MiB)", "4096",
       INT_FLAG(server.max_body_bytes, 1024, INT64_MAX)},
      {"--max-connections", true, G::kSecurity,
       "open connections served at once; beyond it 503 and close (default: the open-file limit "
       "less 64)",
       "100", INT_FLAG(server.max_connections, 1, 10000000)},
      {"--keep-alive-timeout", true, G::kSecurity,
       "seconds a connection may wait without a complete request header (default 5)", "2",
       [](ServeConfig& f, const std::string& v) {
         return set_seconds(f.server.keep_alive_timeout, "--keep-alive-timeout", v, 0.1, 3600.0);
       }},
  };
  return kFlags;
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string serve_help() {
  std::string out =
      "usage: m3serve serve [--model-path DIR|ORG/NAME] [options]\n\n"
      "Serves an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models,\n"
      "/health, /health_generate, /tokenize, /detokenize, /metrics). Flags follow SGLang; vLLM's\n"
      "names are accepted where they mean the same. A flag that changes nothing here says so at\n"
      "startup; one whose feature is not built yet is refused.\n";
  for (FlagGroup g : {FlagGroup::kModel, FlagGroup::kParallel, FlagGroup::kMemory,
                      FlagGroup::kScheduling, FlagGroup::kSpeculative, FlagGroup::kServer,
                      FlagGroup::kSecurity}) {
    out += std::string("\n") + group_title(g) + ":\n";
    for (const auto& f : flags()) {
      if (!f.help || f.group != g) continue;
      char line[640];
      std::snprintf(line, sizeof line, "  %-36s %s\n",
                    (std::string(f.name) + (f.takes_value ? " V" : "")).c_str(), f.help);
      out += line;
    }
  }
  out += "\n  --help                               show this help\n";
  return out;
}

std::vector<FlagExample> serve_flag_examples() {
  std::vector<FlagExample> out;
  for (const auto& f : flags()) {
    out.push_back({f.name, f.takes_value ? f.example : "", f.help == nullptr});
  }
  return out;
}

Result<ParsedServeFlags> parse_serve_flags(const std::vector<std::string>& args) {
  ParsedServeFlags parsed;
  ServeConfig& out = parsed.config;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    std::string value;
    bool has_inline = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    std::string normalized = arg;
    std::replace(normalized.begin(), normalized.end(), '_', '-');
    if (normalized == "--help" || normalized == "-h") {
      if (has_inline) return invalid_argument("--help takes no value");
      parsed.help = true;
      continue;
    }
    const Flag* flag = nullptr;
    for (const auto& f : flags())
      if (normalized == f.name) flag = &f;
    const server::FakeFlag* fake = nullptr;
    for (const auto& f : server::fake_flags())
      if (normalized == f.name) fake = &f;
    if (!flag && !fake) {
      if (arg.rfind("--", 0) != 0) {
        return invalid_argument("unexpected argument '" + arg + "' (flags start with --)");
      }
      const Flag* best = nullptr;
      size_t best_d = SIZE_MAX;
      for (const auto& f : flags()) {
        if (!f.help) continue;
        size_t d = edit_distance(normalized, f.name);
        // A prefix of a longer flag ("--mem-fraction") is a strong hint too.
        if (std::string_view(f.name).rfind(normalized, 0) == 0) d = std::min<size_t>(d, 1);
        if (d < best_d) best_d = d, best = &f;
      }
      std::string msg = "unknown flag '" + arg + "'";
      if (best && best_d <= std::max<size_t>(3, normalized.size() / 3)) {
        msg += "; did you mean '" + std::string(best->name) + "'?";
      }
      return invalid_argument(msg + " (see 'm3serve serve --help')");
    }
    const char* name = flag ? flag->name : fake->name;
    const bool takes_value = flag ? flag->takes_value : fake->takes_value;
    if (takes_value && !has_inline) {
      if (i + 1 >= args.size()) return invalid_argument(std::string(name) + " needs a value");
      value = args[++i];
    } else if (!takes_value && has_inline) {
      return invalid_argument(std::string(name) + " takes no value");
    }
    g_current_flag = name;
    Status s = flag ? flag->set(out, value) : fake->set(out.fake, value);
    if (!s.is_ok()) return s;
  }
  // Flags that change nothing in combination with the others.
  if (out.enable_dp_attention && out.dp == 1) {
    out.notices.push_back("--enable-dp-attention: with --dp 1 attention is not split");
  }
  if (out.load_balance_method != "round_robin" && (!out.enable_dp_attention || out.dp == 1)) {
    out.notices.push_back("--load-balance-method " + out.load_balance_method +
                          ": without --enable-dp-attention --dp > 1 there is one group");
  }
  if (out.enable_expert_parallel && out.tp == 1) {
    out.notices.push_back("--enable-expert-parallel: with one rank there are no experts to split");
  }
  if (out.speculative_algorithm.empty()) {
    for (const auto& [set, name] :
         {std::pair{out.speculative_block_verification, "--speculative-use-block-verification"},
          std::pair{!out.speculative_draft_model_path.empty(), "--speculative-draft-model-path"},
          std::pair{out.speculative_draft_load_format != "auto",
                    "--speculative-draft-load-format"},
          std::pair{out.speculative_num_draft_tokens != 0, "--speculative-num-draft-tokens"},
          std::pair{out.speculative_simulate_accept_length != 0,
                    "--speculative-simulate-accept-length"}}) {
      if (set) {
        out.notices.push_back(std::string(name) +
                              ": no --speculative-algorithm, nothing to draft or verify");
      }
    }
  }
  if (out.kv_cache_dtype == "bf16" && out.device == "cuda") {
    out.notices.push_back("--kv-cache-dtype bf16: the GPU's KV cache is bf16 already (auto)");
  }
  out.server.model_path = out.model_path;
  if (out.server.served_model_names.empty()) {
    std::string name = out.model_path.empty() ? "m3-tiny" : out.model_path;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    out.server.served_model_names.push_back(name);
  }
  return parsed;
}

}  // namespace m3::app
