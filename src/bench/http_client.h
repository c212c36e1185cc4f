// A small HTTP/1.1 client on Boost.Beast for the benchmark: one connection per request (as
// sglang's and vLLM's benchmark clients do), the response body handed over piece by piece as it
// arrives so the caller can timestamp streamed tokens. Plain http:// only.
#pragma once

// clang-format off
// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>: include it first.
#include <utility>
// clang-format on
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <functional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace m3::bench {

// Where the server is: host, port and a path prefix (from --base-url, e.g. "/api").
struct Endpoint {
  std::string host = "127.0.0.1";
  std::string port = "8000";
  std::string path_prefix;  // no trailing '/'
};

// Parses "http://host[:port][/prefix]"; https is refused (kUnimplemented), as is anything else.
Result<Endpoint> parse_base_url(std::string_view url);

struct HttpRequest {
  std::string method = "POST";  // GET or POST
  std::string target;           // path and query, prefix included
  std::string body;             // JSON; empty for GET
  std::string api_key;          // sent as "Authorization: Bearer <key>" when not empty
  double timeout_s = 0;         // whole exchange, connect to last byte; 0: no limit
};

struct HttpOutcome {
  int status = 0;         // HTTP status; 0 when none was received
  std::string transport;  // a transport error (connect, read, reset), empty when the exchange ended
};

using BodySink = std::function<void(std::string_view bytes)>;

// Sends `req` to one of `addrs` and streams the response body into `on_body` as each read
// completes (chunked transfer encoding already removed). Never throws for network errors: they
// come back in HttpOutcome::transport.
boost::asio::awaitable<HttpOutcome> http_exchange(
    const boost::asio::ip::tcp::resolver::results_type& addrs, const Endpoint& ep,
    const HttpRequest& req, BodySink on_body);

// Resolves the endpoint's host (once per run, not per request).
Result<boost::asio::ip::tcp::resolver::results_type> resolve(boost::asio::io_context& io,
                                                             const Endpoint& ep);

// A blocking GET of a whole (small) body, for GET /v1/models before the run (30 s limit).
Result<std::string> http_get(const Endpoint& ep, const std::string& target,
                             const std::string& api_key);

}  // namespace m3::bench
