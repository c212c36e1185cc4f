// Health probes: GET /health on every worker every --health-check-interval-secs. A worker is
// taken out of the pool after two failed probes in a row (one slow answer from a busy CPU worker
// is not enough) and put back after one success. The proxy also takes a worker out at once when
// a connection to it fails; only a probe brings it back.
// clang-format off
#include <utility>  // before Asio (Boost 1.74's awaitable.hpp misses it)
// clang-format on
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>

#include "router/router.h"
#include "router/upstream_client.h"

namespace m3::router {

namespace net = boost::asio;

namespace {
constexpr int kFailuresToMarkDown = 2;
}  // namespace

net::awaitable<void> Router::probe(std::shared_ptr<Worker> worker) {
  auto strand = co_await net::this_coro::executor;
  auto call = std::make_shared<UpstreamCall>(strand);
  UpstreamRequest req;
  req.method = "GET";
  req.target = worker->endpoint.path_prefix + "/health";
  req.timeout_s = flags_.health_check_timeout_s;
  const UpstreamOutcome out =
      co_await call->run(worker->endpoint, req, [](const UpstreamOutcome&) {},
                         [](std::string_view) {});
  const bool ok = out.transport.empty() && out.status == 200;
  if (ok) {
    worker->consecutive_probe_failures.store(0);
    if (!worker->healthy.exchange(true)) {
      std::fprintf(stderr, "m3serve router: worker %s is healthy\n", worker->url.c_str());
    }
    co_return;
  }
  const int failures = worker->consecutive_probe_failures.fetch_add(1) + 1;
  if (failures >= kFailuresToMarkDown && worker->healthy.exchange(false)) {
    std::fprintf(stderr, "m3serve router: worker %s is unhealthy (%s)\n", worker->url.c_str(),
                 out.transport.empty() ? ("HTTP " + std::to_string(out.status)).c_str()
                                       : out.transport.c_str());
  }
}

net::awaitable<void> Router::health_loop() {
  net::steady_timer timer(co_await net::this_coro::executor);
  for (;;) {
    timer.expires_after(std::chrono::duration_cast<net::steady_timer::duration>(
        std::chrono::duration<double>(flags_.health_check_interval_s)));
    boost::system::error_code ec;
    co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return;
    // Each probe on its own strand, so one slow worker does not delay the others.
    for (const auto& w : workers_.all()) {
      net::co_spawn(net::make_strand(http_->io_context()), probe(w), net::detached);
    }
  }
}

}  // namespace m3::router
