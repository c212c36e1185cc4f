#include "bench/report.h"

#include <cmath>
#include <cstdio>
#include <map>

namespace m3::bench {

namespace {

constexpr size_t kMaxErrorsListed = 10;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void row(std::string& out, const std::string& label, const std::string& value) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-40s %-10s\n", label.c_str(), value.c_str());
  out += buf;
}

void rule(std::string& out, const std::string& title, char fill) {
  const size_t width = 50;
  const size_t side = (width - title.size()) / 2;
  out += std::string(side, fill) + title + std::string(width - side - title.size(), fill) + "\n";
}

void latency_rows(std::string& out, const char* name, const Summary& s, bool with_max) {
  row(out, std::string("Mean ") + name + " (ms):", fmt("%.2f", s.mean));
  row(out, std::string("Median ") + name + " (ms):", fmt("%.2f", s.median));
  row(out, std::string("P90 ") + name + " (ms):", fmt("%.2f", s.p90));
  row(out, std::string("P99 ") + name + " (ms):", fmt("%.2f", s.p99));
  if (with_max) row(out, std::string("Max ") + name + " (ms):", fmt("%.2f", s.max));
}

// JSON has no infinity: an unlimited rate is written as the string "inf".
nlohmann::ordered_json rate_json(double rate) {
  if (std::isinf(rate)) return "inf";
  return rate;
}

void put_summary(nlohmann::ordered_json& j, const char* name, const Summary& s) {
  const std::string n(name);
  j["mean_" + n + "_ms"] = s.mean;
  j["median_" + n + "_ms"] = s.median;
  j["std_" + n + "_ms"] = s.std;
  j["p90_" + n + "_ms"] = s.p90;
  j["p95_" + n + "_ms"] = s.p95;
  j["p99_" + n + "_ms"] = s.p99;
  j["max_" + n + "_ms"] = s.max;
}

}  // namespace

std::string format_table(const RunDescription& run, const Aggregate& a) {
  std::string out;
  rule(out, " Serving Benchmark Result ", '=');
  row(out, "Backend:", run.backend);
  row(out, "Model:", run.model);
  row(out, "Traffic request rate:",
      std::isinf(run.request_rate) ? "inf" : fmt("%.2f", run.request_rate));
  row(out, "Max request concurrency:",
      run.max_concurrency > 0 ? std::to_string(run.max_concurrency) : "not set");
  row(out, "Successful requests:", std::to_string(a.completed));
  row(out, "Failed requests:", std::to_string(a.failed));
  row(out, "Benchmark duration (s):", fmt("%.2f", a.duration_s));
  row(out, "Total input tokens:", std::to_string(a.total_input_tokens));
  row(out, "Total generated tokens:", std::to_string(a.total_output_tokens));
  if (a.cache_reported) {
    row(out, "Total cached prompt tokens:", std::to_string(a.total_cached_tokens));
    row(out, "Prefix cache hit rate:", fmt("%.4f", a.prefix_hit_rate));
  }
  row(out, "Request throughput (req/s):", fmt("%.2f", a.request_throughput));
  row(out, "Input token throughput (tok/s):", fmt("%.2f", a.input_throughput));
  row(out, "Output token throughput (tok/s):", fmt("%.2f", a.output_throughput));
  row(out, "Total token throughput (tok/s):", fmt("%.2f", a.total_throughput));
  row(out, "Concurrency:", fmt("%.2f", a.concurrency));
  rule(out, "End-to-End Latency", '-');
  latency_rows(out, "E2E Latency", a.e2e_ms, false);
  rule(out, "Time to First Token", '-');
  latency_rows(out, "TTFT", a.ttft_ms, false);
  rule(out, "Time per Output Token (excl. 1st token)", '-');
  latency_rows(out, "TPOT", a.tpot_ms, false);
  rule(out, "Inter-Token Latency", '-');
  latency_rows(out, "ITL", a.itl_ms, true);
  if (run.mixed_streams > 0) {
    rule(out, "Stream ITL beside arriving prompts", '-');
    row(out, "Stream ITL gaps, idle / loaded:",
        std::to_string(run.mixed.idle_ms.count) + " / " + std::to_string(run.mixed.loaded_ms.count));
    latency_rows(out, "ITL idle", run.mixed.idle_ms, true);
    latency_rows(out, "ITL loaded", run.mixed.loaded_ms, true);
    row(out, "P99 ITL loaded / idle:", fmt("%.2f", run.mixed.p99_ratio));
  }
  if (run.spec.present) {
    rule(out, "Speculative Decoding", '-');
    row(out, "Verify steps:", std::to_string(run.spec.verify_steps));
    row(out, "Mean accepted length:", fmt("%.2f", run.spec.mean_accept_length));
    row(out, "Draft tokens accepted / drafted:",
        std::to_string(run.spec.accepted_tokens) + " / " + std::to_string(run.spec.draft_tokens));
    row(out, "Draft acceptance rate:", fmt("%.3f", run.spec.acceptance_rate));
  }
  out += std::string(50, '=') + "\n";
  return out;
}

nlohmann::ordered_json to_json(const RunDescription& run, const Aggregate& a,
                               const std::vector<RequestResult>& results, bool details) {
  nlohmann::ordered_json j;
  j["backend"] = run.backend;
  j["base_url"] = run.base_url;
  j["model"] = run.model;
  j["dataset_name"] = run.dataset;
  j["request_rate"] = rate_json(run.request_rate);
  if (run.max_concurrency > 0) {
    j["max_concurrency"] = run.max_concurrency;
  } else {
    j["max_concurrency"] = nullptr;
  }
  j["num_prompts"] = run.num_prompts;
  j["random_input_len"] = run.random_input_len;
  j["random_output_len"] = run.random_output_len;
  j["random_range_ratio"] = run.random_range_ratio;
  j["seed"] = run.seed;
  j["warmup_requests"] = run.warmup_requests;
  j["completed"] = a.completed;
  j["failed"] = a.failed;
  j["duration"] = a.duration_s;
  j["total_input_tokens"] = a.total_input_tokens;
  j["total_output_tokens"] = a.total_output_tokens;
  if (a.cache_reported) {
    j["total_cached_tokens"] = a.total_cached_tokens;
    j["prefix_hit_rate"] = a.prefix_hit_rate;
  } else {
    j["total_cached_tokens"] = nullptr;
    j["prefix_hit_rate"] = nullptr;
  }
  j["request_throughput"] = a.request_throughput;
  j["input_throughput"] = a.input_throughput;
  j["output_throughput"] = a.output_throughput;
  j["total_throughput"] = a.total_throughput;
  j["concurrency"] = a.concurrency;
  put_summary(j, "e2e_latency", a.e2e_ms);
  put_summary(j, "ttft", a.ttft_ms);
  put_summary(j, "tpot", a.tpot_ms);
  put_summary(j, "itl", a.itl_ms);
  if (run.mixed_streams > 0) {
    j["mixed_streams"] = run.mixed_streams;
    j["itl_idle_gaps"] = run.mixed.idle_ms.count;
    j["itl_loaded_gaps"] = run.mixed.loaded_ms.count;
    put_summary(j, "itl_idle", run.mixed.idle_ms);
    put_summary(j, "itl_loaded", run.mixed.loaded_ms);
    j["p99_itl_loaded_over_idle"] = run.mixed.p99_ratio;
  }
  if (run.spec.present) {
    // SGLang's name for the mean (accept_length in its bench_serving output), and the counts.
    j["accept_length"] = run.spec.mean_accept_length;
    j["spec_verify_steps"] = run.spec.verify_steps;
    j["spec_draft_tokens"] = run.spec.draft_tokens;
    j["spec_accepted_tokens"] = run.spec.accepted_tokens;
    j["spec_acceptance_rate"] = run.spec.acceptance_rate;
  }
  // Distinct failures with how often each happened (a dead server repeats one message N times).
  std::map<std::pair<int, std::string>, int> counts;
  for (const RequestResult& r : results) {
    if (!r.success) ++counts[{r.http_status, r.error}];
  }
  nlohmann::ordered_json errors = nlohmann::ordered_json::array();
  for (const auto& [key, n] : counts) {
    if (errors.size() == kMaxErrorsListed) break;
    errors.push_back({{"http_status", key.first}, {"message", key.second}, {"count", n}});
  }
  j["errors"] = errors;
  if (details) {
    // Built apart and moved in: ordered_json keeps members in a vector, so references into
    // `j` do not survive the next insertion.
    auto in = nlohmann::ordered_json::array(), out = nlohmann::ordered_json::array();
    auto ttfts = nlohmann::ordered_json::array(), itls = nlohmann::ordered_json::array();
    auto errs = nlohmann::ordered_json::array();
    for (const RequestResult& r : results) {
      in.push_back(r.prompt_tokens);
      out.push_back(r.output_tokens);
      ttfts.push_back(r.ttft_s);
      itls.push_back(r.itl_s);
      errs.push_back(r.error);
    }
    j["input_lens"] = std::move(in);
    j["output_lens"] = std::move(out);
    j["ttfts"] = std::move(ttfts);
    j["itls"] = std::move(itls);
    j["request_errors"] = std::move(errs);
  }
  return j;
}

}  // namespace m3::bench
