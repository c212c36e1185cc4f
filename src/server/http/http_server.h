// Asynchronous HTTP/1.1 server on Boost.Beast/Asio: keep-alive, a request body limit (413 before
// the body is read), "Expect: 100-continue", chunked Server-Sent Events, and client-disconnect
// detection while a response is being produced (streaming or not), so the request can be
// cancelled at once. One strand per connection; a few I/O threads hold thousands of connections.
//
// Handlers get a Request and a Responder. The Responder is thread-safe (every call is posted to
// the connection's strand) and outlives the connection harmlessly: calls after a disconnect or
// after the response ended are ignored.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/status.h"

namespace boost::asio {
class io_context;
}

namespace m3::server::http {

struct Request {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // path and query as sent
  std::string path;                            // without the query
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::chrono::steady_clock::time_point received;

  // Header value ("" when absent); `name` in lower case.
  const std::string& header(const std::string& name) const;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

class Responder {
 public:
  virtual ~Responder() = default;
  // A complete response (Content-Length).
  virtual void send(int status, std::string content_type, std::string body,
                    Headers headers = {}) = 0;
  // Starts a 200 text/event-stream response (chunked); then send_event() any number of times
  // and end_stream() once. `event` is the full event text, e.g. "data: {...}\n\n".
  virtual void start_stream(Headers headers = {}) = 0;
  virtual void send_event(std::string event) = 0;
  virtual void end_stream() = 0;
  // True once the client has gone away (or the connection failed).
  virtual bool disconnected() const = 0;
  // `fn` runs once, on the connection's strand, if the client disconnects before the response
  // ends; immediately (posted) if it already has.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  // Runs `fn` on the connection's strand (serialized with this connection's I/O).
  virtual void post(std::function<void()> fn) = 0;
};

using HandlerFn = std::function<void(Request&& request, std::shared_ptr<Responder> responder)>;

struct ServerConfig {
  std::string host = "0.0.0.0";
  uint16_t port = 30000;
  size_t max_body_bytes = 64u << 20;
  int io_threads = 4;
  std::chrono::seconds idle_timeout{300};  // a keep-alive connection with no request
};

class HttpServer {
 public:
  HttpServer(ServerConfig config, HandlerFn handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (an error names the address), then starts the I/O threads.
  Status start();
  uint16_t port() const { return bound_port_; }  // the real port (config port 0 = any free)

  // Draining: stop accepting; responses from now on carry "Connection: close".
  void stop_accepting();
  // Stops all I/O (open connections are dropped) and joins the threads.
  void stop();

  int64_t open_connections() const { return open_connections_.load(); }
  bool closing() const { return closing_.load(); }
  boost::asio::io_context& io_context();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ServerConfig config_;
  HandlerFn handler_;
  uint16_t bound_port_ = 0;
  std::atomic<int64_t> open_connections_{0};
  std::atomic<bool> closing_{false};
  std::vector<std::thread> threads_;

  friend class Session;
};

}  // namespace m3::server::http
