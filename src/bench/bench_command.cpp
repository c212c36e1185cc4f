#include "bench/bench_command.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "bench/mixed_itl.h"
#include "bench/report.h"
#include "bench/spec_metrics.h"
#include "bench/stats.h"

namespace m3::bench {

namespace {

constexpr const char* kUsage = R"(usage: m3serve bench [options]

Benchmarks a running OpenAI-compatible server (m3serve, SGLang, vLLM): N streaming requests at a
request rate (Poisson arrivals) and/or a fixed concurrency; prints throughput, TTFT, TPOT, ITL
and E2E latency percentiles.

server:
  --host H                 server host (default 127.0.0.1)
  --port P                 server port (default 30000)
  --base-url URL           http://host:port[/prefix]; overrides --host/--port
  --model NAME             model name (default: the first of GET /v1/models)
  --api-key K              sent as a Bearer token
  --backend B              openai-completions (default, /v1/completions, token-id prompts)
                           or openai-chat (/v1/chat/completions, random-word prompts)
workload:
  --dataset D              random (default): lengths uniform in [len*(1-ratio), len];
                           fixed: every request exactly --random-input-len/--random-output-len;
                           multi-turn: conversations whose every turn adds a user message of
                           --random-input-len words to the previous turns and their answers
                           (text prompts; instead of --num-prompts)
                           mixed: --mixed-streams long generations, then --num-prompts long
                           prompts arriving beside them; the stream ITL is reported apart for
                           gaps with and without a long prompt in flight
  --num-conversations C    multi-turn: conversations (default 8)
  --turns T                multi-turn: turns per conversation, sent one after the other
                           (default 4)
  --mixed-streams S        mixed: generations started together, --random-input-len prompt
                           and --random-output-len tokens each (default 8)
  --mixed-prompt-len L     mixed: the arriving prompts' tokens (default 8192)
  --mixed-prompt-output-len O
                           mixed: tokens each arriving prompt generates (default 16)
  --mixed-delay S          mixed: seconds of streams alone before the first arrival (default 5)
  --num-prompts N          number of requests (mixed: the arriving prompts) (default 1000)
  --random-input-len I     prompt tokens (default 1024)
  --random-output-len O    generated tokens per request, max_tokens (default 1024)
  --random-range-ratio R   0..1 (default 0: exact lengths)
  --random-vocab-size V    prompt token ids uniform in [0, V) (default 4032: the ordinary
                           tokens of models/m3-tiny; any larger vocabulary has them too)
  --seed S                 workload and arrival seed (default 1)
  --temperature T          sampling temperature (default 0)
  --disable-ignore-eos     let requests stop at EOS (default: ignore_eos, fixed output lengths)
  --extra-request-body J   a JSON object merged into every request body, e.g. '{"top_p":0.9}'
traffic:
  --max-concurrency C      at most C requests in flight (default: no limit)
  --request-timeout S      a request without its whole response after S seconds fails
                           (default 0: no limit)
  --request-rate R         requests/s, Poisson arrivals; inf sends all at once (default inf)
output:
  --output-file F          write the JSON result to F
  --json                   print the JSON result on stdout instead of the table
  --output-details         add per-request arrays to the JSON (input_lens, output_lens, ttfts,
                           itls, request_errors)
  --disable-progress       no progress line on stderr (shown only on a terminal anyway)
  --warmup-requests N      send the first N prompts once (at most 16 output tokens),
                           untimed, before the run (default 1)

Exit status: 0 when every request succeeded, 1 when any failed, 2 for bad options.
)";

// Warm-up requests generate only this many tokens: enough to exercise decode, cheap on a slow
// server with long outputs.
constexpr int kWarmupOutputLen = 16;

Result<long long> parse_int(const std::string& flag, const std::string& v, long long lo,
                            long long hi) {
  long long x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi) {
    return invalid_argument(flag + " '" + v + "': expected an integer in [" + std::to_string(lo) +
                            ", " + std::to_string(hi) + "]");
  }
  return x;
}

Result<double> parse_double(const std::string& flag, const std::string& v) {
  if (v == "inf" || v == "Inf" || v == "INF") return std::numeric_limits<double>::infinity();
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  return invalid_argument(flag + " '" + v + "': expected a number");
}

}  // namespace

Result<BenchFlags> parse_bench_flags(const std::vector<std::string>& args) {
  BenchFlags f;
  std::string host = "127.0.0.1", port = "30000";
  bool num_prompts_given = false;
  std::string multi_turn_flag;  // a multi-turn-only flag given, to refuse it without multi-turn
  std::string mixed_flag;       // likewise for the mixed workload's flags
  f.run.arrival_delay_s = 5.0;
  f.run.request_rate = std::numeric_limits<double>::infinity();
  f.run.progress = isatty(STDERR_FILENO) != 0;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string value;
    bool has_inline = false;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_inline = true;
    }
    auto next = [&]() -> Result<std::string> {
      if (has_inline) return value;
      if (i + 1 >= args.size()) return invalid_argument(flag + " needs a value");
      return args[++i];
    };
    if (flag == "--help" || flag == "-h") {
      f.help = true;
    } else if (flag == "--json") {
      f.json_stdout = true;
    } else if (flag == "--output-details") {
      f.output_details = true;
    } else if (flag == "--disable-progress") {
      f.run.progress = false;
    } else if (flag == "--disable-ignore-eos") {
      f.run.params.ignore_eos = false;
    } else {
      M3_ASSIGN_OR_RETURN(std::string v, next());
      if (flag == "--host") {
        host = v;
      } else if (flag == "--port") {
        M3_ASSIGN_OR_RETURN(long long p, parse_int(flag, v, 1, 65535));
        port = std::to_string(p);
      } else if (flag == "--base-url") {
        f.base_url = v;
      } else if (flag == "--model") {
        f.run.params.model = v;
      } else if (flag == "--api-key") {
        f.run.api_key = v;
      } else if (flag == "--backend") {
        if (v == "openai-completions" || v == "openai" || v == "sglang-oai") {
          f.run.backend = Backend::kOpenAiCompletions;
        } else if (v == "openai-chat" || v == "sglang-oai-chat") {
          f.run.backend = Backend::kOpenAiChat;
        } else {
          return invalid_argument("--backend '" + v +
                                  "': expected openai-completions or openai-chat");
        }
      } else if (flag == "--dataset" || flag == "--dataset-name") {
        if (v == "random") {
          f.workload.dataset = DatasetKind::kRandom;
        } else if (v == "fixed") {
          f.workload.dataset = DatasetKind::kFixed;
        } else if (v == "multi-turn" || v == "multi_turn") {
          f.workload.dataset = DatasetKind::kMultiTurn;
        } else if (v == "mixed") {
          f.workload.dataset = DatasetKind::kMixed;
        } else {
          return invalid_argument(flag + " '" + v +
                                  "': expected random, fixed, multi-turn or mixed");
        }
      } else if (flag == "--mixed-streams") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 100'000));
        f.workload.mixed_streams = static_cast<int>(n);
        mixed_flag = flag;
      } else if (flag == "--mixed-prompt-len") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 100'000'000));
        f.workload.mixed_prompt_len = static_cast<int>(n);
        mixed_flag = flag;
      } else if (flag == "--mixed-prompt-output-len") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 100'000'000));
        f.workload.mixed_prompt_output_len = static_cast<int>(n);
        mixed_flag = flag;
      } else if (flag == "--mixed-delay") {
        M3_ASSIGN_OR_RETURN(double d, parse_double(flag, v));
        if (!(d >= 0 && d <= 86400)) return invalid_argument("--mixed-delay must be in [0, 86400]");
        f.run.arrival_delay_s = d;
        mixed_flag = flag;
      } else if (flag == "--num-conversations") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 1'000'000));
        f.workload.num_conversations = static_cast<int>(n);
        multi_turn_flag = flag;
      } else if (flag == "--turns") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 10'000));
        f.workload.turns = static_cast<int>(n);
        multi_turn_flag = flag;
      } else if (flag == "--num-prompts") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 10'000'000));
        f.workload.num_prompts = static_cast<int>(n);
        num_prompts_given = true;
      } else if (flag == "--random-input-len") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 10'000'000));
        f.workload.input_len = static_cast<int>(n);
      } else if (flag == "--random-output-len") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 10'000'000));
        f.workload.output_len = static_cast<int>(n);
      } else if (flag == "--random-range-ratio") {
        M3_ASSIGN_OR_RETURN(double r, parse_double(flag, v));
        if (!(r >= 0 && r <= 1)) return invalid_argument("--random-range-ratio must be in [0, 1]");
        f.workload.range_ratio = r;
      } else if (flag == "--random-vocab-size") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 100'000'000));
        f.workload.vocab_size = static_cast<int>(n);
      } else if (flag == "--seed") {
        M3_ASSIGN_OR_RETURN(long long n,
                            parse_int(flag, v, 0, std::numeric_limits<long long>::max()));
        f.workload.seed = static_cast<uint64_t>(n);
      } else if (flag == "--temperature") {
        M3_ASSIGN_OR_RETURN(double t, parse_double(flag, v));
        if (t < 0) return invalid_argument("--temperature must be >= 0");
        f.run.params.temperature = t;
      } else if (flag == "--max-concurrency") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 1, 1'000'000));
        f.run.max_concurrency = static_cast<int>(n);
      } else if (flag == "--request-rate") {
        M3_ASSIGN_OR_RETURN(double r, parse_double(flag, v));
        if (!(r > 0)) return invalid_argument("--request-rate must be positive (or inf)");
        f.run.request_rate = r;
      } else if (flag == "--warmup-requests") {
        M3_ASSIGN_OR_RETURN(long long n, parse_int(flag, v, 0, 1'000'000));
        f.warmup_requests = static_cast<int>(n);
      } else if (flag == "--request-timeout") {
        M3_ASSIGN_OR_RETURN(double t, parse_double(flag, v));
        if (!(t >= 0) || std::isinf(t)) {
          return invalid_argument("--request-timeout must be a finite number of seconds >= 0");
        }
        f.run.timeout_s = t;
      } else if (flag == "--extra-request-body") {
        const auto j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object()) return invalid_argument("--extra-request-body must be a JSON object");
        f.run.params.extra_body = v;
      } else if (flag == "--output-file") {
        f.output_file = v;
      } else {
        return invalid_argument("unknown option '" + flag + "' (see 'm3serve bench --help')");
      }
    }
  }
  if (f.run.api_key.empty()) {
    // As sglang.bench_serving does: OpenAI-style auth from the environment.
    if (const char* key = std::getenv("OPENAI_API_KEY"); key != nullptr) f.run.api_key = key;
  }
  if (f.base_url.empty()) {
    const bool v6 = host.find(':') != std::string::npos;
    f.base_url = "http://" + (v6 ? "[" + host + "]" : host) + ":" + port;
  }
  M3_ASSIGN_OR_RETURN(f.run.endpoint, parse_base_url(f.base_url));
  f.run.seed = f.workload.seed;
  const bool multi_turn = f.workload.dataset == DatasetKind::kMultiTurn;
  if (!multi_turn && !multi_turn_flag.empty()) {
    return invalid_argument(multi_turn_flag + " needs --dataset multi-turn");
  }
  if (f.workload.dataset != DatasetKind::kMixed && !mixed_flag.empty()) {
    return invalid_argument(mixed_flag + " needs --dataset mixed");
  }
  // A conversation's history is text (the answers come back as text), so its prompts are too.
  f.workload.token_ids = f.run.backend == Backend::kOpenAiCompletions && !multi_turn;
  if (multi_turn && num_prompts_given) {
    return invalid_argument(
        "--num-prompts does not apply to --dataset multi-turn (its requests are "
        "--num-conversations * --turns)");
  }
  if (multi_turn) {
    f.workload.num_prompts = f.workload.num_conversations * f.workload.turns;
  }
  return f;
}

namespace {

// GET /v1/models and the first model's id.
Result<std::string> first_model(const RunOptions& run) {
  M3_ASSIGN_OR_RETURN(std::string body,
                      http_get(run.endpoint, run.endpoint.path_prefix + "/v1/models", run.api_key));
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object()) {
    auto data = j.find("data");
    if (data != j.end() && data->is_array() && !data->empty() && (*data)[0].is_object()) {
      auto id = (*data)[0].find("id");
      if (id != (*data)[0].end() && id->is_string()) return id->get<std::string>();
    }
  }
  return invalid_argument("GET /v1/models returned no model (" + body.substr(0, 200) +
                          "); pass --model");
}

}  // namespace

int run_bench_command(const std::vector<std::string>& args) {
  Result<BenchFlags> parsed = parse_bench_flags(args);
  if (!parsed) {
    std::fprintf(stderr, "m3serve bench: %s\n", parsed.status().message().c_str());
    return 2;
  }
  BenchFlags& f = *parsed;
  if (f.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  // One socket per request in flight: lift the soft descriptor limit (often 1024) to the hard one.
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (f.run.params.model.empty()) {
    Result<std::string> model = first_model(f.run);
    if (!model) {
      std::fprintf(stderr, "m3serve bench: cannot find the model: %s\n",
                   model.status().message().c_str());
      return 1;
    }
    f.run.params.model = *model;
  }
  Result<std::vector<BenchRequest>> workload = make_workload(f.workload);
  if (!workload) {
    std::fprintf(stderr, "m3serve bench: %s\n", workload.status().message().c_str());
    return 2;
  }
  std::fprintf(
      stderr, "[bench] %d requests to %s%s (model %s), rate %s, concurrency %s\n",
      f.workload.num_prompts, f.base_url.c_str(), backend_path(f.run.backend),
      f.run.params.model.c_str(),
      std::isinf(f.run.request_rate) ? "inf" : std::to_string(f.run.request_rate).c_str(),
      f.run.max_concurrency > 0 ? std::to_string(f.run.max_concurrency).c_str() : "not set");
  std::fflush(stderr);
  if (f.warmup_requests > 0) {
    // Untimed, one at a time: first-request costs (connection setup, lazy allocations, caches)
    // stay out of the numbers. A failure here is reported; the run then shows it per request.
    RunOptions warm = f.run;
    warm.progress = false;
    warm.max_concurrency = 1;
    warm.request_rate = std::numeric_limits<double>::infinity();
    const size_t n = std::min(workload->size(), static_cast<size_t>(f.warmup_requests));
    std::vector<BenchRequest> first(workload->begin(), workload->begin() + n);
    for (BenchRequest& r : first) {
      r.output_len = std::min(r.output_len, kWarmupOutputLen);
      if (r.conversation >= 0) {
        // Alone, and with its own text, so it seeds no conversation's prefix in the cache.
        r.conversation = -1;
        r.turn = 0;
        r.prompt_text = "warm up: " + r.prompt_text;
      }
    }
    Result<RunOutput> w = run_benchmark(warm, first);
    if (w && !w->results.empty() && !w->results[0].success) {
      std::fprintf(stderr, "[bench] warm-up request failed: %s\n", w->results[0].error.c_str());
    }
  }
  // The server's speculative counters around the timed run (not an error when it has none).
  const auto spec_counters = [&f] {
    Result<std::string> text =
        http_get(f.run.endpoint, f.run.endpoint.path_prefix + "/metrics", f.run.api_key);
    return text ? parse_spec_counters(*text) : SpecCounters{};
  };
  const SpecCounters spec_before = spec_counters();
  Result<RunOutput> out = run_benchmark(f.run, *workload);
  if (!out) {
    std::fprintf(stderr, "m3serve bench: %s\n", out.status().message().c_str());
    return 1;
  }
  const Aggregate agg = aggregate(out->results, out->duration_s);
  RunDescription desc;
  desc.backend = backend_name(f.run.backend);
  desc.base_url = f.base_url;
  desc.model = f.run.params.model;
  desc.dataset = f.workload.dataset == DatasetKind::kFixed       ? "fixed"
                 : f.workload.dataset == DatasetKind::kMultiTurn ? "multi-turn"
                 : f.workload.dataset == DatasetKind::kMixed     ? "mixed"
                                                                 : "random";
  if (f.workload.dataset == DatasetKind::kMixed) {
    desc.mixed_streams = f.workload.mixed_streams;
    desc.mixed = split_itl_by_load(out->results, static_cast<size_t>(f.workload.mixed_streams));
  }
  desc.spec = spec_between(spec_before, spec_counters());
  desc.request_rate = f.run.request_rate;
  desc.max_concurrency = f.run.max_concurrency;
  desc.num_prompts = f.workload.num_prompts;
  desc.random_input_len = f.workload.input_len;
  desc.random_output_len = f.workload.output_len;
  desc.random_range_ratio = f.workload.range_ratio;
  desc.seed = f.workload.seed;
  desc.warmup_requests = f.warmup_requests;
  const nlohmann::ordered_json j = to_json(desc, agg, out->results, f.output_details);
  if (f.json_stdout) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fputs(format_table(desc, agg).c_str(), stdout);
  }
  if (!f.output_file.empty()) {
    std::ofstream file(f.output_file);
    file << j.dump(2) << "\n";
    if (!file) {
      std::fprintf(stderr, "m3serve bench: cannot write --output-file '%s'\n",
                   f.output_file.c_str());
      return 1;
    }
  }
  for (const auto& e : j["errors"]) {
    std::fprintf(stderr, "[bench] %d failed: HTTP %d: %s\n", e["count"].get<int>(),
                 e["http_status"].get<int>(), e["message"].get<std::string>().c_str());
  }
  return agg.failed == 0 ? 0 : 1;
}

}  // namespace m3::bench
