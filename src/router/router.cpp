#include "router/router.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <future>

#include "router/cache_aware_policy.h"
#include "server/protocol/errors.h"

namespace m3::router {

namespace net = boost::asio;

std::unique_ptr<RoutingPolicy> make_policy(const RouterFlags& f) {
  const uint64_t seed =
      f.seed != 0 ? f.seed
                  : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  switch (f.policy) {
    case PolicyKind::kRoundRobin:
      return std::make_unique<RoundRobinPolicy>();
    case PolicyKind::kRandom:
      return std::make_unique<RandomPolicy>(seed);
    case PolicyKind::kPowerOfTwo:
      return std::make_unique<PowerOfTwoPolicy>(seed);
    case PolicyKind::kCacheAware:
      break;
  }
  CacheAwareConfig c;
  c.cache_threshold = f.cache_threshold;
  c.balance_abs_threshold = f.balance_abs_threshold;
  c.balance_rel_threshold = f.balance_rel_threshold;
  c.max_tree_size = static_cast<size_t>(f.max_tree_size);
  return std::make_unique<CacheAwarePolicy>(c);
}

Router::Router(RouterFlags flags) : flags_(std::move(flags)), policy_(make_policy(flags_)) {
  server::http::ServerConfig config;
  config.host = flags_.host;
  config.port = static_cast<uint16_t>(flags_.port);
  // A streamed response can take minutes; the router never times a client out while it waits.
  config.io_threads = 4;
  http_ = std::make_unique<server::http::HttpServer>(
      config, [this](Request&& req, std::shared_ptr<Responder> responder) {
        handle(std::move(req), std::move(responder));
      });
}

Router::~Router() {
  stop();
}

Status Router::start() {
  std::signal(SIGPIPE, SIG_IGN);
  for (const std::string& url : flags_.worker_urls) M3_RETURN_IF_ERROR(add_worker(url));
  M3_RETURN_IF_ERROR(http_->start());
  net::co_spawn(http_->io_context(), health_loop(), net::detached);
  net::co_spawn(http_->io_context(), eviction_loop(), net::detached);
  return Status::ok();
}

uint16_t Router::port() const {
  return http_->port();
}

void Router::stop() {
  if (http_) http_->stop();
}

void Router::wait_for_signal() {
  std::promise<int> got;
  auto fut = got.get_future();
  net::signal_set signals(http_->io_context(), SIGTERM, SIGINT);
  signals.async_wait(
      [&got](const boost::system::error_code& ec, int sig) { got.set_value(ec ? 0 : sig); });
  const int sig = fut.get();
  std::fprintf(stderr, "m3serve router: received signal %d, stopping\n", sig);
  signals.cancel();
  stop();
}

Status Router::add_worker(const std::string& url) {
  M3_ASSIGN_OR_RETURN(std::shared_ptr<Worker> w, workers_.add(url));
  std::fprintf(stderr, "m3serve router: worker %s added\n", w->url.c_str());
  // Probe it at once, so that a dead URL stops getting requests before the next round.
  if (!http_->closing()) {
    net::co_spawn(net::make_strand(http_->io_context()), probe(w), net::detached);
  }
  return Status::ok();
}

bool Router::remove_worker(const std::string& url) {
  std::shared_ptr<Worker> w = workers_.remove(url);
  if (!w) return false;
  policy_->forget_worker(w->id);
  std::fprintf(stderr, "m3serve router: worker %s removed\n", w->url.c_str());
  return true;
}

bool Router::authorized(const Request& req) const {
  if (flags_.api_key.empty()) return true;
  return req.header("authorization") == "Bearer " + flags_.api_key;
}

void Router::handle_health(Responder& responder) const {
  for (const auto& w : workers_.all()) {
    if (w->healthy.load()) {
      responder.send(200, "application/json", "{}");
      return;
    }
  }
  responder.send(503, "application/json",
                 server::unavailable("No healthy worker.", "no_available_workers").body());
}

void Router::handle(Request&& req, std::shared_ptr<Responder> responder) {
  // /health is the router's own (any healthy worker), open like a worker's; /health_generate
  // runs a generation, so it goes to a worker behind the key like any route (as on a worker).
  if (req.path == "/health") {
    handle_health(*responder);
    return;
  }
  if (!authorized(req)) {
    const server::ApiError e = server::unauthorized();
    responder->send(e.status, "application/json", e.body());
    return;
  }
  if (req.path == "/metrics") {
    responder->send(200, "text/plain; version=0.0.4", metrics_text());
    return;
  }
  if (req.path == "/add_worker" || req.path == "/remove_worker" || req.path == "/list_workers") {
    handle_admin(req, *responder);
    return;
  }
  net::co_spawn(net::make_strand(http_->io_context()), proxy(std::move(req), std::move(responder)),
                net::detached);
}

net::awaitable<void> Router::eviction_loop() {
  net::steady_timer timer(co_await net::this_coro::executor);
  for (;;) {
    timer.expires_after(std::chrono::duration_cast<net::steady_timer::duration>(
        std::chrono::duration<double>(flags_.eviction_interval_s)));
    boost::system::error_code ec;
    co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return;
    policy_->evict();
  }
}

}  // namespace m3::router
