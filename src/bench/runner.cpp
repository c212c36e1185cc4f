#include "bench/runner.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace m3::bench {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class Run {
 public:
  Run(const RunOptions& options, const std::vector<BenchRequest>& requests,
      tcp::resolver::results_type addrs)
      : options_(options),
        requests_(requests),
        addrs_(std::move(addrs)),
        slot_freed_(io_),
        results_(requests.size()) {}

  RunOutput go() {
    start_ = Clock::now();
    net::co_spawn(io_, launch(), [](std::exception_ptr) {});
    io_.run();
    RunOutput out;
    out.duration_s = seconds_between(start_, last_end_ > start_ ? last_end_ : Clock::now());
    out.results = std::move(results_);
    return out;
  }

 private:
  // Waits for a concurrency slot and takes it.
  net::awaitable<void> take_slot() {
    boost::system::error_code ec;
    while (options_.max_concurrency > 0 && in_flight_ >= options_.max_concurrency) {
      // A finishing request cancels this wait (every waiter wakes and checks again).
      slot_freed_.expires_at(Clock::time_point::max());
      co_await slot_freed_.async_wait(net::redirect_error(net::use_awaitable, ec));
    }
    ++in_flight_;
  }

  // Multi-turn: conversation c's turns [first, first + turns), one after the other.
  net::awaitable<void> conversation(size_t first, size_t turns) {
    std::vector<std::string> history;
    for (size_t i = first; i < first + turns; ++i) {
      if (i > first) co_await take_slot();
      co_await one(i, history);
      history.push_back(requests_[i].prompt_text);
      history.push_back(results_[i].output_text);
    }
  }

  net::awaitable<void> launch_conversations() {
    std::vector<std::pair<size_t, size_t>> convs;  // first request, number of turns
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (i == 0 || requests_[i].conversation != requests_[i - 1].conversation) {
        convs.push_back({i, 0});
      }
      ++convs.back().second;
    }
    const std::vector<double> arrivals =
        poisson_arrivals(static_cast<int>(convs.size()), options_.request_rate, options_.seed);
    net::steady_timer timer(io_);
    boost::system::error_code ec;
    for (size_t c = 0; c < convs.size(); ++c) {
      const auto due = start_ + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(arrivals[c]));
      if (due > Clock::now()) {
        timer.expires_at(due);
        co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
      }
      co_await take_slot();
      net::co_spawn(io_, conversation(convs[c].first, convs[c].second),
                    [](std::exception_ptr) {});
    }
  }

  // Sends request i at its arrival time, once a concurrency slot is free.
  net::awaitable<void> launch() {
    if (!requests_.empty() && requests_[0].conversation >= 0) {
      co_await launch_conversations();
      co_return;
    }
    // Streams (mixed workloads) at 0; the rest at their Poisson times after the delay.
    size_t streams = 0;
    while (streams < requests_.size() && requests_[streams].stream) ++streams;
    std::vector<double> arrivals(streams, 0.0);
    for (double t : poisson_arrivals(static_cast<int>(requests_.size() - streams),
                                     options_.request_rate, options_.seed)) {
      arrivals.push_back((streams > 0 ? options_.arrival_delay_s : 0.0) + t);
    }
    net::steady_timer timer(io_);
    boost::system::error_code ec;
    for (size_t i = 0; i < requests_.size(); ++i) {
      const auto due = start_ + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(arrivals[i]));
      if (due > Clock::now()) {
        timer.expires_at(due);
        co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
      }
      co_await take_slot();
      net::co_spawn(io_, one(i, {}), [](std::exception_ptr) {});
    }
  }

  // Sends request i (its slot already taken) and releases the slot when it ends.
  net::awaitable<void> one(size_t i, std::vector<std::string> history) {
    const BenchRequest& request = requests_[i];
    RequestResult& r = results_[i];
    r.prompt_tokens = request.input_len;
    const Clock::time_point sent = Clock::now();
    r.start_s = seconds_between(start_, sent);
    StreamReader reader(options_.backend, /*keep_text=*/request.conversation >= 0);
    HttpRequest http;
    http.method = "POST";
    http.target = options_.endpoint.path_prefix + backend_path(options_.backend);
    http.body = request_body(options_.backend, options_.params, request, history);
    http.api_key = options_.api_key;
    http.timeout_s = options_.timeout_s;
    HttpOutcome outcome;
    try {
      outcome = co_await http_exchange(addrs_, options_.endpoint, http, [&](std::string_view b) {
        reader.on_bytes(b, seconds_between(sent, Clock::now()));
      });
    } catch (const std::exception& e) {  // e.g. bad_alloc; the run goes on
      outcome.transport = std::string("client error: ") + e.what();
    }
    const Clock::time_point end = Clock::now();
    r.http_status = outcome.status;
    reader.finish(r, seconds_between(sent, end), outcome.transport);
    if (end > last_end_) last_end_ = end;
    --in_flight_;
    ++done_;
    slot_freed_.cancel();
    if (options_.progress) {
      std::fprintf(stderr, "\r[bench] %zu/%zu done", done_, requests_.size());
      if (done_ == requests_.size()) std::fprintf(stderr, "\n");
    }
  }

  const RunOptions& options_;
  const std::vector<BenchRequest>& requests_;
  tcp::resolver::results_type addrs_;
  net::io_context io_{1};
  net::steady_timer slot_freed_;
  std::vector<RequestResult> results_;
  Clock::time_point start_;
  Clock::time_point last_end_{};
  int in_flight_ = 0;
  size_t done_ = 0;
};

}  // namespace

Result<RunOutput> run_benchmark(const RunOptions& options,
                                const std::vector<BenchRequest>& requests) {
  if (!(options.request_rate > 0)) {
    return invalid_argument("--request-rate must be positive (or inf)");
  }
  if (options.max_concurrency < 0) {
    return invalid_argument("--max-concurrency must be positive");
  }
  net::io_context resolver_io;
  M3_ASSIGN_OR_RETURN(tcp::resolver::results_type addrs, resolve(resolver_io, options.endpoint));
  Run run(options, requests, std::move(addrs));
  return run.go();
}

}  // namespace m3::bench
