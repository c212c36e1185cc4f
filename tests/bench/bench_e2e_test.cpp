// End to end: `m3serve serve` on the bundled m3-tiny (CPU), then `m3serve bench` against it as a
// separate process, checking its JSON; and `m3serve bench` against a dead port, which must report
// failures and exit 1, not crash.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/http_client.h"

extern char** environ;

namespace m3::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The server, started once for the suite: loading m3-tiny takes a few seconds of the CI's cores.
// The port in the server's "... on http://HOST:PORT" line, or "" (no <regex>: GCC 12's regex
// trips -Wmaybe-uninitialized under the sanitizer build's -O2).
std::string listening_port(const std::string& log) {
  const std::string marker = "on http://";
  for (size_t at = log.find(marker); at != std::string::npos; at = log.find(marker, at + 1)) {
    const size_t colon = log.find(':', at + marker.size());
    if (colon == std::string::npos) return "";
    size_t end = colon + 1;
    while (end < log.size() && log[end] >= '0' && log[end] <= '9') ++end;
    if (end > colon + 1) return log.substr(colon + 1, end - colon - 1);
  }
  return "";
}

class Server {
 public:
  bool start(std::string* why, const std::vector<std::string>& extra_args = {}) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<std::string> args = {M3SERVE_BIN, "serve", "--host", "127.0.0.1", "--port", "0"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, M3SERVE_BIN, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) {
      *why = "cannot start " + std::string(M3SERVE_BIN);
      return false;
    }
    // Keep draining stderr so the server never blocks on a full pipe.
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard<std::mutex> lock(mu_);
        log_.append(buf, static_cast<size_t>(n));
      }
      close(fd);
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline && port_.empty()) {
      port_ = listening_port(log());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (port_.empty()) {
      *why = "the server did not listen:\n" + log();
      return false;
    }
    // It listens first and loads the model in the background: /health is 503 until loaded.
    Endpoint ep;
    ep.port = port_;
    while (std::chrono::steady_clock::now() < deadline) {
      if (http_get(ep, "/health", "").is_ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    *why = "the model did not load:\n" + log();
    return false;
  }

  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = 0;
    }
    if (reader_.joinable()) reader_.join();
  }

  std::string log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  const std::string& port() const { return port_; }

 private:
  pid_t pid_ = 0;
  std::string port_;
  std::thread reader_;
  std::mutex mu_;
  std::string log_;
};

struct BenchRun {
  int exit_code = -1;  // -1: killed by a signal
  json result;
  std::string output;  // stdout and stderr
};

BenchRun run_bench(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("m3bench_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path out_json = dir / "result.json";
  const fs::path out_log = dir / "log.txt";
  fs::remove(out_json);
  const std::string cmd = std::string(M3SERVE_BIN) + " bench --disable-progress " + args +
                          " --output-file " + out_json.string() + " > " + out_log.string() +
                          " 2>&1";
  const int status = std::system(cmd.c_str());
  BenchRun r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::ifstream log(out_log);
  r.output.assign(std::istreambuf_iterator<char>(log), {});
  std::ifstream in(out_json);
  if (in) r.result = json::parse(in, nullptr, false);
  return r;
}

class bench_e2e : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new Server;
    if (!server_->start(&why_)) {
      server_->stop();
      delete server_;
      server_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    if (server_) server_->stop();
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << why_; }

  static Server* server_;
  static std::string why_;
};
Server* bench_e2e::server_ = nullptr;
std::string bench_e2e::why_;

TEST_F(bench_e2e, CompletionsAtConcurrency4) {
  const BenchRun r = run_bench("--port " + server_->port() +
                               " --num-prompts 16 --max-concurrency 4 --random-input-len 32"
                               " --random-output-len 8");
  ASSERT_EQ(r.exit_code, 0) << r.output << "\nserver log:\n" << server_->log();
  ASSERT_TRUE(r.result.is_object()) << r.output;
  const json& j = r.result;
  EXPECT_NE(r.output.find("Serving Benchmark Result"), std::string::npos) << r.output;
  EXPECT_EQ(j["model"], "m3-tiny");  // found through GET /v1/models
  EXPECT_EQ(j["backend"], "openai-completions");
  EXPECT_EQ(j["completed"], 16);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["total_output_tokens"], 16 * 8);  // ignore_eos: exactly max_tokens each
  EXPECT_EQ(j["total_input_tokens"], 16 * 32);  // the server's usage of 32 random ids each
  // No draft: no speculative section.
  EXPECT_FALSE(j.contains("accept_length")) << j.dump();
  EXPECT_EQ(r.output.find("Speculative Decoding"), std::string::npos) << r.output;
  const double duration = j["duration"];
  EXPECT_GT(duration, 0.0);
  EXPECT_NEAR(j["request_throughput"].get<double>(), 16 / duration, 1e-6 * 16 / duration);
  EXPECT_NEAR(j["output_throughput"].get<double>(), 128 / duration, 1e-6 * 128 / duration);
  EXPECT_NEAR(j["total_throughput"].get<double>(), (128 + 512) / duration, 1e-6 * 640 / duration);
  // At most 4 in flight: the mean number in flight cannot exceed 4.
  EXPECT_GT(j["concurrency"].get<double>(), 0.0);
  EXPECT_LE(j["concurrency"].get<double>(), 4.0 + 1e-9);
  for (const char* m : {"ttft", "tpot", "itl", "e2e_latency"}) {
    const std::string n(m);
    const double mean = j["mean_" + n + "_ms"], median = j["median_" + n + "_ms"];
    const double p90 = j["p90_" + n + "_ms"], p99 = j["p99_" + n + "_ms"];
    const double mx = j["max_" + n + "_ms"];
    EXPECT_GT(mean, 0.0) << n;
    EXPECT_LE(median, p90) << n;
    EXPECT_LE(p90, p99) << n;
    EXPECT_LE(p99, mx) << n;
    EXPECT_LE(mean, mx) << n;
  }
  EXPECT_LE(j["max_ttft_ms"].get<double>(), j["max_e2e_latency_ms"].get<double>());
  EXPECT_LE(j["mean_ttft_ms"].get<double>(), j["mean_e2e_latency_ms"].get<double>());
  // TPOT x 7 later tokens + TTFT = E2E per request, so the means add up too.
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>() + 7 * j["mean_tpot_ms"].get<double>(),
              j["mean_e2e_latency_ms"].get<double>(),
              1e-6 * j["mean_e2e_latency_ms"].get<double>());
  EXPECT_LE(j["max_e2e_latency_ms"].get<double>(), duration * 1e3 + 1e-6);
  EXPECT_TRUE(j["errors"].empty());
}

TEST_F(bench_e2e, ChatWithRequestRate) {
  const BenchRun r = run_bench("--port " + server_->port() +
                               " --backend openai-chat --model m3-tiny --num-prompts 4"
                               " --request-rate 20 --random-input-len 16 --random-output-len 6"
                               " --json --output-details");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.result["completed"], 4);
  EXPECT_EQ(r.result["total_output_tokens"], 4 * 6);
  EXPECT_EQ(r.result["request_rate"], 20.0);
  EXPECT_NE(r.output.find("\"mean_ttft_ms\""), std::string::npos);  // --json: JSON on stdout
  // --output-details: one entry per request, in workload order.
  ASSERT_EQ(r.result["ttfts"].size(), 4u);
  ASSERT_EQ(r.result["itls"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.result["output_lens"][i], 6);
    EXPECT_GT(r.result["input_lens"][i].get<int>(), 16);  // 16 words inside the chat template
    EXPECT_GT(r.result["ttfts"][i].get<double>(), 0.0);
    EXPECT_EQ(r.result["request_errors"][i], "");
  }
}

// A port nobody listens on: bind one, read its number, close it.
std::string dead_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return std::to_string(ntohs(addr.sin_port));
}

// With m3-tiny's DSpark draft the report gains the acceptance the server's metrics saw during
// the run (the warm-up excluded), and the JSON its counts.
TEST(bench_e2e_dspark, ReportsTheAcceptanceOfTheRun) {
  Server server;
  std::string why;
  ASSERT_TRUE(server.start(&why, {"--speculative-algorithm", "DSPARK"})) << why;
  const BenchRun r = run_bench("--port " + server.port() +
                               " --backend openai-chat --num-prompts 4 --max-concurrency 2"
                               " --random-input-len 16 --random-output-len 24");
  server.stop();
  ASSERT_EQ(r.exit_code, 0) << r.output << "\nserver log:\n" << server.log();
  const json& j = r.result;
  EXPECT_NE(r.output.find("Speculative Decoding"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Mean accepted length:"), std::string::npos) << r.output;
  ASSERT_TRUE(j.contains("accept_length")) << j.dump();
  const int64_t steps = j["spec_verify_steps"], drafted = j["spec_draft_tokens"];
  const int64_t accepted = j["spec_accepted_tokens"];
  const double mean = j["accept_length"];
  // 4 requests of 24 tokens: every committed token after a request's first comes from a verify
  // step (ignore_eos), at most 8 per step (block 7 + the target's token).
  EXPECT_GT(steps, 0);
  EXPECT_LE(steps, 4 * 23);
  EXPECT_GE(mean, 1.0);
  EXPECT_LE(mean, 8.0);
  EXPECT_GE(accepted, 0);
  EXPECT_LE(accepted, drafted);
  EXPECT_NEAR(j["spec_acceptance_rate"].get<double>(),
              drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0, 1e-12);
}

TEST(bench_e2e_dead, RequestsToADeadPortFailCleanly) {
  const std::string port = dead_port();
  const BenchRun r =
      run_bench("--port " + port + " --model m3-tiny --num-prompts 5 --max-concurrency 2");
  ASSERT_EQ(r.exit_code, 1) << r.output;  // not a signal, not a usage error
  ASSERT_TRUE(r.result.is_object()) << r.output;
  EXPECT_EQ(r.result["completed"], 0);
  EXPECT_EQ(r.result["failed"], 5);
  ASSERT_EQ(r.result["errors"].size(), 1u);
  EXPECT_EQ(r.result["errors"][0]["count"], 5);
  EXPECT_EQ(r.result["errors"][0]["http_status"], 0);
  EXPECT_NE(r.result["errors"][0]["message"].get<std::string>().find("connect"), std::string::npos);
  EXPECT_NE(r.output.find("Failed requests:"), std::string::npos);

  // Without --model the model lookup fails first, with a message and exit 1.
  const BenchRun r2 = run_bench("--port " + port + " --num-prompts 2");
  EXPECT_EQ(r2.exit_code, 1) << r2.output;
  EXPECT_NE(r2.output.find("cannot find the model"), std::string::npos) << r2.output;
}

}  // namespace
}  // namespace m3::bench
