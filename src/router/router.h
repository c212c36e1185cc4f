// The router process: an HTTP listener (the server's), the worker pool, a routing policy, a
// health prober and the prefix trees' eviction timer. Request handling is split by concern:
// router.cpp (dispatch, auth, lifecycle), proxy.cpp (forwarding and retries),
// admin_routes.cpp (/add_worker, /remove_worker, /list_workers), router_metrics.cpp (/metrics),
// health_checker.cpp (probes).
#pragma once

#include <atomic>
#include <memory>
#include <string>

// clang-format off
#include <utility>  // before Asio's awaitable.hpp (Boost 1.74 misses it)
// clang-format on
#include <boost/asio/awaitable.hpp>

#include "router/policy.h"
#include "router/router_flags.h"
#include "router/worker_registry.h"
#include "server/http/http_server.h"

namespace m3::router {

// Builds the policy the flags ask for.
std::unique_ptr<RoutingPolicy> make_policy(const RouterFlags& flags);

class Router {
 public:
  explicit Router(RouterFlags flags);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Adds the --worker-urls workers, listens, and starts probing and eviction.
  Status start();
  uint16_t port() const;
  // Waits for SIGTERM or SIGINT, then stops (requests in flight are cut).
  void wait_for_signal();
  void stop();

 private:
  using Request = server::http::Request;
  using Responder = server::http::Responder;

  void handle(Request&& req, std::shared_ptr<Responder> responder);
  bool authorized(const Request& req) const;

  boost::asio::awaitable<void> proxy(Request req, std::shared_ptr<Responder> responder);
  // /v1/models and other routes that are not generation go to any healthy worker.
  void handle_admin(const Request& req, Responder& responder);
  std::string metrics_text() const;
  void handle_health(Responder& responder) const;

  boost::asio::awaitable<void> health_loop();
  boost::asio::awaitable<void> probe(std::shared_ptr<Worker> worker);
  boost::asio::awaitable<void> eviction_loop();

  Status add_worker(const std::string& url);
  bool remove_worker(const std::string& url);

  RouterFlags flags_;
  WorkerRegistry workers_;
  std::unique_ptr<RoutingPolicy> policy_;
  std::unique_ptr<server::http::HttpServer> http_;
  std::atomic<int64_t> requests_total_{0};
  std::atomic<int64_t> retries_total_{0};
  std::atomic<int64_t> no_worker_total_{0};
  std::atomic<int64_t> cache_routed_total_{0};
  std::atomic<int64_t> load_routed_total_{0};
};

}  // namespace m3::router
