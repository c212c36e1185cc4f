#include "server/http/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <mutex>

#include "server/http/request_parsing.h"
#include "server/protocol/errors.h"

namespace m3::server::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;

const std::string& Request::header(const std::string& name) const {
  static const std::string kEmpty;
  auto it = headers.find(name);
  return it == headers.end() ? kEmpty : it->second;
}

struct HttpServer::Impl {
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::executor_work_guard<net::io_context::executor_type> work = net::make_work_guard(ioc);
};

namespace {

std::string status_line(int status) {
  auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) +
         "\r\n";
}

}  // namespace

class SessionResponder;

// One connection. All members are touched only on the strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer& server) : stream_(std::move(socket)), server_(server) {
    server_.open_connections_.fetch_add(1);
  }
  ~Session() { server_.open_connections_.fetch_sub(1); }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  // --- called on the strand by SessionResponder ---
  void respond(uint64_t gen, int status, const std::string& content_type, std::string body,
               const Headers& headers) {
    if (gen != gen_ || response_started_ || closed_) return;
    response_started_ = true;
    std::string out = status_line(status);
    out += "Content-Type: " + content_type + "\r\n";
    out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
    promised_keep_alive_ = keep_alive();
    out += promised_keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    // HEAD: the GET response's header, Content-Length included, and never a body (RFC 9110 9.3.2).
    if (!head_request_) out += body;
    response_done_ = true;
    queue(std::move(out));
  }
  void start_stream(uint64_t gen, const Headers& headers) {
    if (gen != gen_ || response_started_ || closed_) return;
    response_started_ = true;
    streaming_ = true;
    std::string out = status_line(200);
    out +=
        "Content-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\n"
        "X-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n";
    for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
    promised_keep_alive_ = keep_alive();
    out += promised_keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    queue(std::move(out));
  }
  void send_event(uint64_t gen, const std::string& event) {
    if (gen != gen_ || !streaming_ || response_done_ || closed_ || event.empty()) return;
    char size[20];
    std::snprintf(size, sizeof size, "%zx\r\n", event.size());
    std::string chunk = size;
    chunk += event;
    chunk += "\r\n";
    queue(std::move(chunk), /*coalesce=*/true);
  }
  void end_stream(uint64_t gen) {
    if (gen != gen_ || !streaming_ || response_done_ || closed_) return;
    response_done_ = true;
    queue("0\r\n\r\n", /*coalesce=*/true);
  }
  void add_disconnect_callback(uint64_t gen, std::function<void()> fn) {
    if (gen != gen_ || response_done_) return;
    if (closed_) {
      fn();
      return;
    }
    on_disconnect_.push_back(std::move(fn));
  }
  bool closed() const { return closed_; }
  net::any_io_executor executor() { return stream_.get_executor(); }

 private:
  bool keep_alive() const { return keep_alive_ && !server_.closing(); }

  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_.config_.max_header_bytes));
    parser_->body_limit(server_.config_.max_body_bytes);
    stream_.expires_after(server_.config_.keep_alive_timeout);
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    // Beast checks Content-Length against the body limit while parsing the header.
    if (ec) return on_read_error(ec);
    if (auto rejection = check_request_header(*parser_)) return reject(*rejection);
    stream_.expires_after(server_.config_.body_timeout);
    const auto& req = parser_->get();
    auto expect = req.find(bhttp::field::expect);
    if (expect != req.end() && beast::iequals(expect->value(), "100-continue")) {
      auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*cont),
                       [self = shared_from_this(), cont](beast::error_code ec, size_t) {
                         if (ec) return self->close();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    bhttp::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  // A malformed or over-limit request gets its status; a closed socket or a timeout gets nothing.
  void on_read_error(const beast::error_code& ec) {
    const int status = read_error_status(ec);
    if (status == 0) return close();
    if (status == 413) {
      return reject({413, payload_too_large(server_.config_.max_body_bytes).message});
    }
    if (status == 431) {
      return reject({431, "The request's header is larger than the limit of " +
                              std::to_string(server_.config_.max_header_bytes) + " bytes."});
    }
    return reject({status, "Malformed HTTP request: " + ec.message() + "."});
  }

  // Answers and closes: after a request the server refuses at the HTTP level, the rest of the
  // bytes on the connection cannot be framed reliably.
  void reject(const Rejection& rejection) {
    ++gen_;
    response_started_ = true;
    response_done_ = true;
    keep_alive_ = false;
    promised_keep_alive_ = false;
    stream_.expires_never();
    queue(rejection_response(rejection));
  }

  void on_read(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    keep_alive_ = parser_->get().keep_alive();
    Request req = to_request(parser_->release());
    head_request_ = req.method == "HEAD";

    ++gen_;
    response_started_ = false;
    response_done_ = false;
    streaming_ = false;
    on_disconnect_.clear();
    watch();
    auto responder = make_responder();
    try {
      server_.handler_(std::move(req), responder);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "m3serve: internal error in a request handler: %s\n", e.what());
      respond(gen_, 500, "application/json",
              internal_error("The server failed to process the request; the error is logged.")
                  .body(),
              {});
    }
  }

  std::shared_ptr<Responder> make_responder();

  // While the response is being produced, wait for the socket to become readable: EOF there
  // means the client went away (HTTP/1.1 clients do not send before the response ends, except
  // for pipelining, which just stops the watch).
  void watch() {
    if (closed_ || watching_) return;
    watching_ = true;
    stream_.socket().async_wait(tcp::socket::wait_read,
                                [self = shared_from_this(), g = gen_](beast::error_code ec) {
                                  self->watching_ = false;
                                  self->on_watch(ec, g);
                                });
  }

  void on_watch(beast::error_code ec, uint64_t g) {
    if (ec || closed_ || g != gen_ || response_done_) return;
    char c;
    ssize_t n = ::recv(stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return close();  // the client is gone
    }
    if (n < 0) watch();  // spurious wake-up
    // n > 0: a pipelined request; it stays in the socket for the next read.
  }

  void queue(std::string data, bool coalesce = false) {
    if (closed_) return;
    if (coalesce && writing_ && outq_.size() > 1) {
      outq_.back() += data;  // not the buffer being written: merge to save syscalls
    } else {
      outq_.push_back(std::move(data));
    }
    if (!writing_) do_write();
  }

  void do_write() {
    writing_ = true;
    net::async_write(
        stream_, net::buffer(outq_.front()),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (ec) return close();
    outq_.pop_front();
    if (!outq_.empty()) return do_write();
    if (!response_done_) return;
    on_disconnect_.clear();  // the response is complete: nothing to cancel any more
    // What the response header told the client: a drain that began while the response was on
    // the wire still reads the next request (and answers it 503, Connection: close) rather than
    // closing a connection the client was told stays open.
    if (!promised_keep_alive_) return linger_close();
    // Stop watching (no other operation is pending now) and read the next request.
    if (watching_) {
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
    }
    do_read();
  }

  // Half-close, then read and discard what the client still sends (an unread request body)
  // for a short while, so that closing does not reset the connection before the client has read
  // our response (a 413, say).
  void linger_close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(5));
    do_linger();
  }
  void do_linger() {
    auto scratch = std::make_shared<std::array<char, 16384>>();
    stream_.async_read_some(net::buffer(*scratch),
                            [self = shared_from_this(), scratch](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->do_linger();
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    bool notify = gen_ > 0 && !response_done_;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    auto callbacks = std::move(on_disconnect_);
    on_disconnect_.clear();
    if (notify)
      for (auto& fn : callbacks) fn();
  }

  beast::tcp_stream stream_;
  HttpServer& server_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::deque<std::string> outq_;
  bool writing_ = false;
  bool watching_ = false;
  bool closed_ = false;
  bool keep_alive_ = true;
  bool head_request_ = false;  // the current request is a HEAD: no body in its response
  bool promised_keep_alive_ = false;  // the Connection header of the current response
  uint64_t gen_ = 0;  // request number on this connection
  bool response_started_ = false;
  bool response_done_ = true;
  bool streaming_ = false;
  std::vector<std::function<void()>> on_disconnect_;
};

class SessionResponder : public Responder, public std::enable_shared_from_this<SessionResponder> {
 public:
  SessionResponder(std::shared_ptr<Session> s, uint64_t gen)
      : session_(std::move(s)), gen_(gen), exec_(session_->executor()) {}

  void send(int status, std::string content_type, std::string body, Headers headers) override {
    run([gen = gen_, status, content_type = std::move(content_type), body = std::move(body),
         headers = std::move(headers)](Session& s) mutable {
      s.respond(gen, status, content_type, std::move(body), headers);
    });
  }
  void start_stream(Headers headers) override {
    run([gen = gen_, headers = std::move(headers)](Session& s) { s.start_stream(gen, headers); });
  }
  void send_event(std::string event) override {
    run([gen = gen_, event = std::move(event)](Session& s) { s.send_event(gen, event); });
  }
  void end_stream() override {
    run([gen = gen_](Session& s) { s.end_stream(gen); });
  }
  bool disconnected() const override { return gone_.load(); }
  void on_disconnect(std::function<void()> fn) override {
    std::weak_ptr<SessionResponder> weak = weak_from_this();
    run([gen = gen_, weak, fn = std::move(fn)](Session& s) mutable {
      s.add_disconnect_callback(gen, [weak, fn = std::move(fn)] {
        if (auto p = weak.lock()) p->mark_gone();
        fn();
      });
    });
  }
  void post(std::function<void()> fn) override { net::post(exec_, std::move(fn)); }

  void mark_gone() { gone_.store(true); }

 private:
  template <typename F>
  void run(F&& f) {
    // Holding the session keeps it alive until the handler drops its responder.
    net::dispatch(exec_,
                  [s = session_, self = shared_from_this(), f = std::forward<F>(f)]() mutable {
                    if (s->closed()) self->mark_gone();
                    f(*s);
                  });
  }

  std::shared_ptr<Session> session_;
  uint64_t gen_;
  net::any_io_executor exec_;
  std::atomic<bool> gone_{false};
};

std::shared_ptr<Responder> Session::make_responder() {
  auto r = std::make_shared<SessionResponder>(shared_from_this(), gen_);
  // Mark the responder when the connection drops, even if the handler never registers.
  std::weak_ptr<SessionResponder> weak = r;
  on_disconnect_.push_back([weak] {
    if (auto p = weak.lock()) p->mark_gone();
  });
  return r;
}

HttpServer::HttpServer(ServerConfig config, HandlerFn handler)
    : impl_(std::make_unique<Impl>()), config_(std::move(config)), handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  stop();
  impl_.reset();  // sessions die with the io_context, before the counters they update
}

net::io_context& HttpServer::io_context() {
  return impl_->ioc;
}

int64_t max_connections_for_file_limit(uint64_t open_file_limit) {
  // Kept back: 48 descriptors for the process's own files and 16 for refusals in flight.
  constexpr uint64_t kReserved = 64;
  constexpr int64_t kCeiling = 100000;
  if (open_file_limit <= kReserved + 8) return 8;
  return static_cast<int64_t>(std::min<uint64_t>(open_file_limit - kReserved, kCeiling));
}

// The accept loop. Past max_connections a new connection is answered 503 and closed (at most
// kMaxRefusing of those at a time; beyond, it is closed at once). When accept() itself fails for
// want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), it waits before trying again
// instead of spinning on a listener that stays readable.
class Acceptor : public std::enable_shared_from_this<Acceptor> {
 public:
  static constexpr int64_t kMaxRefusing = 16;
  static constexpr auto kBackoff = std::chrono::milliseconds(100);

  Acceptor(tcp::acceptor& acceptor, HttpServer& server)
      : acceptor_(acceptor), server_(server), timer_(acceptor.get_executor()) {}

  void start() { accept(); }

 private:
  void accept() {
    acceptor_.async_accept(net::make_strand(acceptor_.get_executor()),
                           [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
                             self->on_accept(ec, std::move(socket));
                           });
  }

  void on_accept(beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      if (ec == net::error::no_descriptors || ec.value() == ENFILE ||
          ec == net::error::no_buffer_space || ec == net::error::no_memory) {
        return back_off(ec);
      }
      return accept();  // a connection reset before it was accepted, and the like
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    if (server_.open_connections_.load() >= server_.max_connections_) {
      refuse(std::move(socket));
    } else {
      std::make_shared<Session>(std::move(socket), server_)->start();
    }
    accept();
  }

  void back_off(const beast::error_code& ec) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log_ > std::chrono::seconds(10)) {
      last_log_ = now;
      std::fprintf(stderr,
                   "m3serve: cannot accept connections (%s; %lld open): retrying every %lld ms; "
                   "raise the open-file limit or lower --max-connections\n",
                   ec.message().c_str(), static_cast<long long>(server_.open_connections()),
                   static_cast<long long>(kBackoff.count()));
    }
    timer_.expires_after(kBackoff);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->acceptor_.is_open()) return;
      self->accept();
    });
  }

  // 503 and close, without reading the request: the client learns the server is full instead of
  // waiting on a connection nobody will serve.
  void refuse(tcp::socket socket) {
    server_.refused_connections_.fetch_add(1);
    if (server_.refusing_connections_.load() >= kMaxRefusing) return;  // closed as it leaves
    server_.refusing_connections_.fetch_add(1);
    const std::string body =
        unavailable("The server has " + std::to_string(server_.max_connections_) +
                        " connections open, its limit (--max-connections); retry later.",
                    "too_many_connections")
            .body();
    std::make_shared<Refusal>(
        std::move(socket), server_,
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        "Retry-After: 1\r\nContent-Length: " +
            std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body)
        ->start();
  }

  // One refused connection: writes the 503, half-closes, then reads what the client still sends
  // until it closes (or for at most a second), so closing does not reset the connection before
  // the 503 is read. Every pending operation holds it; it ends with the last one.
  class Refusal : public std::enable_shared_from_this<Refusal> {
   public:
    Refusal(tcp::socket s, HttpServer& srv, std::string text)
        : socket_(std::move(s)), timer_(socket_.get_executor()), server_(srv),
          response_(std::move(text)) {}
    ~Refusal() { server_.refusing_connections_.fetch_sub(1); }

    void start() {
      net::async_write(socket_, net::buffer(response_),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         if (ec) return;
                         beast::error_code ignored;
                         self->socket_.shutdown(tcp::socket::shutdown_send, ignored);
                         self->timer_.expires_after(std::chrono::seconds(1));
                         self->timer_.async_wait([self](beast::error_code ec) {
                           if (ec) return;
                           beast::error_code ignored;
                           self->socket_.close(ignored);
                         });
                         self->read();
                       });
    }

   private:
    void read() {
      socket_.async_read_some(net::buffer(scratch_),
                              [self = shared_from_this()](beast::error_code ec, size_t) {
                                if (ec) {
                                  self->timer_.cancel();
                                  return;
                                }
                                self->read();
                              });
    }

    tcp::socket socket_;
    net::steady_timer timer_;
    HttpServer& server_;
    std::string response_;
    std::array<char, 4096> scratch_{};
  };

  tcp::acceptor& acceptor_;
  HttpServer& server_;
  net::steady_timer timer_;
  std::chrono::steady_clock::time_point last_log_{};
};

Status HttpServer::start() {
  beast::error_code ec;
  auto address = net::ip::make_address(config_.host, ec);
  if (ec) {
    // A host name: resolve it.
    tcp::resolver resolver(impl_->ioc);
    auto results = resolver.resolve(config_.host, std::to_string(config_.port), ec);
    if (ec || results.empty()) {
      return invalid_argument("--host '" + config_.host + "': " + ec.message());
    }
    address = results.begin()->endpoint().address();
  }
  tcp::endpoint ep(address, config_.port);
  auto& acc = impl_->acceptor;
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return invalid_argument("cannot listen on " + config_.host + ":" +
                            std::to_string(config_.port) + ": " + ec.message());
  }
  bound_port_ = acc.local_endpoint().port();
  max_connections_ = config_.max_connections;
  if (max_connections_ <= 0) {
    rlimit rl{};
    const uint64_t limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
    max_connections_ = max_connections_for_file_limit(limit);
  }
  std::make_shared<Acceptor>(acc, *this)->start();
  int n = std::max(1, config_.io_threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { impl_->ioc.run(); });
  return Status::ok();
}

void HttpServer::start_draining() {
  closing_.store(true);
}

void HttpServer::stop() {
  if (threads_.empty()) return;
  closing_.store(true);
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);  // no I/O thread is left to race with
}

}  // namespace m3::server::http
