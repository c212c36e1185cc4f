#include "bench/http_client.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>

namespace m3::bench {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

Result<Endpoint> parse_base_url(std::string_view url) {
  constexpr std::string_view kHttp = "http://";
  if (url.substr(0, 8) == "https://") {
    return unimplemented("--base-url '" + std::string(url) +
                         "': https is not supported; use http:// (or a local TLS proxy)");
  }
  if (url.substr(0, kHttp.size()) != kHttp) {
    return invalid_argument("--base-url '" + std::string(url) + "' must start with http://");
  }
  std::string_view rest = url.substr(kHttp.size());
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  Endpoint ep;
  if (slash != std::string_view::npos) {
    ep.path_prefix = std::string(rest.substr(slash));
    while (!ep.path_prefix.empty() && ep.path_prefix.back() == '/') ep.path_prefix.pop_back();
  }
  if (!authority.empty() && authority[0] == '[') {  // [ipv6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return invalid_argument("--base-url '" + std::string(url) + "': unterminated '['");
    }
    ep.host = std::string(authority.substr(1, close - 1));
    authority.remove_prefix(close + 1);
    ep.port = authority.empty() ? "80" : std::string(authority.substr(1));
  } else {
    const size_t colon = authority.rfind(':');
    ep.host = std::string(authority.substr(0, colon));
    ep.port = colon == std::string_view::npos ? "80" : std::string(authority.substr(colon + 1));
  }
  if (ep.host.empty() || ep.port.empty()) {
    return invalid_argument("--base-url '" + std::string(url) + "' has no host or port");
  }
  return ep;
}

Result<tcp::resolver::results_type> resolve(net::io_context& io, const Endpoint& ep) {
  tcp::resolver resolver(io);
  beast::error_code ec;
  auto results = resolver.resolve(ep.host, ep.port, ec);
  if (ec) {
    return unavailable("cannot resolve " + ep.host + ":" + ep.port + ": " + ec.message());
  }
  return results;
}

net::awaitable<HttpOutcome> http_exchange(const tcp::resolver::results_type& addrs,
                                          const Endpoint& ep, const HttpRequest& req,
                                          BodySink on_body) {
  HttpOutcome out;
  tcp::socket socket(co_await net::this_coro::executor);
  // The deadline closes the socket, which ends whichever operation is pending with an error.
  // A handler already queued when the exchange ends still runs (with success) after this frame
  // is gone, so it checks `alive`, which the frame clears on every way out.
  net::steady_timer deadline(socket.get_executor());
  bool timed_out = false;
  auto alive = std::make_shared<bool>(true);
  struct ClearOnExit {
    std::shared_ptr<bool> flag;
    ~ClearOnExit() { *flag = false; }
  } clear_on_exit{alive};
  if (req.timeout_s > 0) {
    deadline.expires_after(std::chrono::duration_cast<net::steady_timer::duration>(
        std::chrono::duration<double>(req.timeout_s)));
    deadline.async_wait([&socket, &timed_out, alive](const beast::error_code& e) {
      if (e || !*alive) return;
      timed_out = true;
      beast::error_code ignored;
      socket.close(ignored);
    });
  }
  auto failure = [&](const std::string& what, const beast::error_code& e) {
    if (timed_out) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "no complete response within %.1f s (%s)", req.timeout_s,
                    what.c_str());
      return std::string(buf);
    }
    return what + ": " + e.message();
  };
  beast::error_code ec;
  co_await net::async_connect(socket, addrs, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    out.transport = failure("connect to " + ep.host + ":" + ep.port, ec);
    co_return out;
  }
  socket.set_option(tcp::no_delay(true), ec);

  http::request<http::string_body> msg(req.method == "GET" ? http::verb::get : http::verb::post,
                                       req.target, 11);
  msg.set(http::field::host, ep.host + ":" + ep.port);
  msg.set(http::field::user_agent, "m3serve-bench");
  msg.set(http::field::accept, "text/event-stream, application/json");
  if (!req.api_key.empty()) msg.set(http::field::authorization, "Bearer " + req.api_key);
  if (!req.body.empty()) {
    msg.set(http::field::content_type, "application/json");
    msg.body() = req.body;
  }
  msg.prepare_payload();
  co_await http::async_write(socket, msg, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    out.transport = failure("send to " + ep.host + ":" + ep.port, ec);
    co_return out;
  }

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  co_await http::async_read_header(socket, buffer, parser,
                                   net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    out.transport = failure("read response header", ec);
    co_return out;
  }
  out.status = parser.get().result_int();
  // read_some, not read: a read returns only when the body buffer is full, which would hold
  // streamed tokens back and falsify the timings.
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    co_await http::async_read_some(socket, buffer, parser,
                                   net::redirect_error(net::use_awaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    const size_t got = sizeof(chunk) - parser.get().body().size;
    if (got > 0) on_body(std::string_view(chunk, got));
    if (ec) {
      out.transport = failure("read response body", ec);
      break;
    }
  }
  socket.shutdown(tcp::socket::shutdown_both, ec);
  deadline.cancel();
  co_return out;
}

Result<std::string> http_get(const Endpoint& ep, const std::string& target,
                             const std::string& api_key) {
  net::io_context io;
  M3_ASSIGN_OR_RETURN(tcp::resolver::results_type addrs, resolve(io, ep));
  std::string body;
  HttpOutcome outcome;
  HttpRequest req;
  req.method = "GET";
  req.target = target;
  req.api_key = api_key;
  req.timeout_s = 30;
  net::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        outcome =
            co_await http_exchange(addrs, ep, req, [&](std::string_view b) { body.append(b); });
      },
      [&](std::exception_ptr e) {
        if (!e) return;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          outcome.transport = x.what();
        }
      });
  io.run();
  const std::string where = "GET http://" + ep.host + ":" + ep.port + target;
  if (!outcome.transport.empty()) return unavailable(where + ": " + outcome.transport);
  if (outcome.status != 200) {
    return unavailable(where + ": HTTP " + std::to_string(outcome.status) + ": " +
                       body.substr(0, 500));
  }
  return body;
}

}  // namespace m3::bench
