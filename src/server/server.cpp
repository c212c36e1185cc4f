#include "server/server.h"

#include <sys/resource.h>

#include <boost/asio/signal_set.hpp>
#include <boost/asio/thread_pool.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <future>
#include <thread>

#include "server/handlers/context.h"
#include "server/handlers/routes.h"
#include "server/http/http_server.h"

namespace m3::server {

struct Server::Impl {
  ServerContext ctx;
  std::unique_ptr<boost::asio::thread_pool> workers;
  std::unique_ptr<http::HttpServer> http;
  bool stopped = false;
  std::atomic<bool> stop_now{false};  // a second signal during the drain
};

void raise_file_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

Server::Server(ServerOptions options, InferenceBackend* backend, const TextCodec* codec,
               const ChatRenderer* renderer)
    : impl_(std::make_unique<Impl>()) {
  auto& ctx = impl_->ctx;
  if (options.served_model_names.empty()) options.served_model_names.push_back("default");
  ctx.options = std::move(options);
  ctx.backend = backend;
  ctx.codec = codec;
  ctx.renderer = renderer;
  ctx.metrics = std::make_unique<Metrics>(ctx.model_name());
  impl_->workers =
      std::make_unique<boost::asio::thread_pool>(std::max(1, ctx.options.worker_threads));
  ctx.workers = impl_->workers.get();
  http::ServerConfig hc;
  hc.host = ctx.options.host;
  hc.port = ctx.options.port;
  hc.max_body_bytes = ctx.options.max_body_bytes;
  hc.max_connections = ctx.options.max_connections;
  hc.keep_alive_timeout = ctx.options.keep_alive_timeout;
  hc.io_threads = ctx.options.io_threads;
  impl_->http = std::make_unique<http::HttpServer>(
      hc, [&ctx](http::Request&& req, std::shared_ptr<http::Responder> res) {
        handle_request(ctx, std::move(req), std::move(res));
      });
  ctx.open_connections = [http = impl_->http.get()] { return http->open_connections(); };
  ctx.refused_connections = [http = impl_->http.get()] { return http->refused_connections(); };
}

Server::~Server() {
  stop();
}

Status Server::start() {
  std::signal(SIGPIPE, SIG_IGN);
  raise_file_limit();
  return impl_->http->start();
}

uint16_t Server::port() const {
  return impl_->http->port();
}

bool Server::drain() {
  auto& ctx = impl_->ctx;
  ctx.draining.store(true);
  // The listener stays open: /health answers 503 and new generation requests are refused with
  // 503 on new connections too, while the requests already running finish.
  impl_->http->start_draining();
  auto deadline = std::chrono::steady_clock::now() + ctx.options.drain_timeout;
  while (ctx.in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline &&
         !impl_->stop_now.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  bool clean = ctx.in_flight.load() == 0;
  // Let the last responses leave the socket buffers.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return clean;
}

void Server::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  // Nothing may outlive the I/O: cancel every live request and wait (with I/O still running)
  // until their jobs are gone, so no backend callback or responder refers to this server later.
  auto& ctx = impl_->ctx;
  ctx.draining.store(true);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ctx.in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(ctx.live_mu);
      ids.assign(ctx.live_ids.begin(), ctx.live_ids.end());
    }
    for (uint64_t id : ids) ctx.backend->cancel(id);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (ctx.in_flight.load() > 0) {
    std::fprintf(stderr, "m3serve: %lld request(s) did not stop after cancel\n",
                 static_cast<long long>(ctx.in_flight.load()));
  }
  impl_->http->stop();
  if (impl_->workers) {
    impl_->workers->stop();
    impl_->workers->join();
  }
}

int Server::wait_for_signal_and_drain() {
  std::promise<int> got;
  auto fut = got.get_future();
  boost::asio::signal_set signals(impl_->http->io_context(), SIGTERM, SIGINT);
  signals.async_wait(
      [&got](const boost::system::error_code& ec, int sig) { got.set_value(ec ? 0 : sig); });
  int sig = fut.get();
  std::fprintf(stderr,
               "m3serve: received signal %d, draining %lld in-flight request(s); a second signal "
               "stops at once\n",
               sig, static_cast<long long>(impl_->ctx.in_flight.load()));
  // A second signal ends the drain: stop() then cancels what is left, and each of those requests
  // still gets its last event (finish_reason "abort") before the process exits.
  signals.async_wait([this](const boost::system::error_code& ec, int) {
    if (!ec) impl_->stop_now.store(true);
  });
  bool clean = drain();
  if (impl_->stop_now.load()) {
    std::fprintf(stderr, "m3serve: second signal: cancelling %lld request(s)\n",
                 static_cast<long long>(impl_->ctx.in_flight.load()));
  } else if (!clean) {
    std::fprintf(stderr, "m3serve: drain timeout; %lld request(s) cut off\n",
                 static_cast<long long>(impl_->ctx.in_flight.load()));
  }
  signals.cancel();
  stop();
  std::fprintf(stderr, "m3serve: stopped\n");
  return clean ? 0 : 1;
}

}  // namespace m3::server
