// One HTTP/1.1 exchange with a worker, for the proxy: a fresh connection per request (so that
// closing it is how a cancelled request reaches the worker, which stops generating when its
// client goes away), the response header handed over before the body, and the body handed over
// read by read, as it arrives (chunked transfer encoding removed), never accumulated here.
#pragma once

// clang-format off
// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>: include it first.
#include <utility>
// clang-format on
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "bench/http_client.h"

namespace m3::router {

struct UpstreamRequest {
  std::string method = "POST";
  std::string target;  // path and query
  std::string body;
  std::string content_type;   // forwarded when not empty
  std::string authorization;  // the client's header, forwarded as sent
  double timeout_s = 0;       // whole exchange; 0: no limit
};

struct UpstreamOutcome {
  int status = 0;            // 0: no response header arrived
  std::string content_type;  // of the response
  std::string transport;     // a transport error, empty when the exchange completed
  bool cancelled = false;    // cancel() ended it
};

// The exchange with its socket, so that another thread can cancel it. Create with
// std::make_shared on a strand executor; run() and cancel() both run on that strand.
class UpstreamCall : public std::enable_shared_from_this<UpstreamCall> {
 public:
  explicit UpstreamCall(boost::asio::any_io_executor strand);

  // `on_header` runs once the status line and headers are in, before any body byte;
  // `on_body` for every piece of the body. Never throws for network errors.
  boost::asio::awaitable<UpstreamOutcome> run(
      const bench::Endpoint& ep, const UpstreamRequest& req,
      std::function<void(const UpstreamOutcome&)> on_header,
      std::function<void(std::string_view)> on_body);

  // Thread-safe: closes the connection (the pending read ends with an error). Idempotent.
  void cancel();

 private:
  boost::asio::any_io_executor strand_;
  boost::asio::ip::tcp::socket socket_;
  bool cancelled_ = false;  // on the strand
};

}  // namespace m3::router
