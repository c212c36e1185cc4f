#include "router/upstream_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <limits>

namespace m3::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

UpstreamCall::UpstreamCall(net::any_io_executor strand) : strand_(strand), socket_(strand) {}

void UpstreamCall::cancel() {
  net::post(strand_, [self = shared_from_this()] {
    self->cancelled_ = true;
    beast::error_code ignored;
    self->socket_.close(ignored);
  });
}

net::awaitable<UpstreamOutcome> UpstreamCall::run(
    const bench::Endpoint& ep, const UpstreamRequest& req,
    std::function<void(const UpstreamOutcome&)> on_header,
    std::function<void(std::string_view)> on_body) {
  UpstreamOutcome out;
  auto self = shared_from_this();  // the timer's handler may outlive this frame
  net::steady_timer deadline(strand_);
  bool timed_out = false;
  auto alive = std::make_shared<bool>(true);
  struct ClearOnExit {
    std::shared_ptr<bool> flag;
    ~ClearOnExit() { *flag = false; }
  } clear_on_exit{alive};
  if (req.timeout_s > 0) {
    deadline.expires_after(std::chrono::duration_cast<net::steady_timer::duration>(
        std::chrono::duration<double>(req.timeout_s)));
    deadline.async_wait([self, &timed_out, alive](const beast::error_code& e) {
      if (e || !*alive) return;
      timed_out = true;
      beast::error_code ignored;
      self->socket_.close(ignored);
    });
  }
  const std::string where = ep.host + ":" + ep.port;
  auto failure = [&](const std::string& what, const beast::error_code& e) {
    out.cancelled = cancelled_;
    if (timed_out) return what + ": no complete response within the request timeout";
    return what + ": " + e.message();
  };
  beast::error_code ec;
  tcp::resolver resolver(strand_);
  auto addrs =
      co_await resolver.async_resolve(ep.host, ep.port, net::redirect_error(net::use_awaitable, ec));
  if (ec || cancelled_) {
    out.transport = failure("resolve " + where, ec);
    co_return out;
  }
  co_await net::async_connect(socket_, addrs, net::redirect_error(net::use_awaitable, ec));
  if (ec || cancelled_) {
    out.transport = failure("connect to " + where, ec);
    co_return out;
  }
  socket_.set_option(tcp::no_delay(true), ec);

  http::request<http::string_body> msg(http::string_to_verb(req.method), req.target, 11);
  if (msg.method() == http::verb::unknown) msg.method_string(req.method);
  msg.set(http::field::host, where);
  msg.set(http::field::user_agent, "m3serve-router");
  msg.set(http::field::connection, "close");
  if (!req.authorization.empty()) msg.set(http::field::authorization, req.authorization);
  if (!req.content_type.empty()) msg.set(http::field::content_type, req.content_type);
  msg.body() = req.body;
  msg.prepare_payload();
  co_await http::async_write(socket_, msg, net::redirect_error(net::use_awaitable, ec));
  if (ec || cancelled_) {
    out.transport = failure("send to " + where, ec);
    co_return out;
  }

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  // A HEAD response announces a body length but sends none.
  if (msg.method() == http::verb::head) parser.skip(true);
  co_await http::async_read_header(socket_, buffer, parser,
                                   net::redirect_error(net::use_awaitable, ec));
  if (ec || cancelled_) {
    out.transport = failure("read the response header from " + where, ec);
    co_return out;
  }
  out.status = parser.get().result_int();
  if (auto ct = parser.get().find(http::field::content_type); ct != parser.get().end()) {
    out.content_type = std::string(ct->value());
  }
  on_header(out);
  // read_some, not read: a read returns only when the buffer is full, which would hold streamed
  // tokens back.
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    co_await http::async_read_some(socket_, buffer, parser,
                                   net::redirect_error(net::use_awaitable, ec));
    if (ec == http::error::need_buffer) ec = {};
    const size_t got = sizeof(chunk) - parser.get().body().size;
    if (got > 0 && !cancelled_) on_body(std::string_view(chunk, got));
    if (ec || cancelled_) {
      out.transport = failure("read the response body from " + where, ec);
      break;
    }
  }
  socket_.shutdown(tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  deadline.cancel();
  co_return out;
}

}  // namespace m3::router
