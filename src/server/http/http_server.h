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
  std::string method;                          // "GET", "POST", ... (HEAD gets no body back)
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
  size_t max_header_bytes = 64u << 10;  // request line + headers; beyond it 431
  int io_threads = 4;
  // How long a connection may sit without a complete request header: an idle keep-alive
  // connection, or a client sending its header slowly. Then it is closed.
  std::chrono::milliseconds keep_alive_timeout{5000};
  // How long the body of a request may take to arrive once its header has.
  std::chrono::milliseconds body_timeout{60000};
  // Open connections served at once; beyond it a new connection gets 503 and is closed.
  // 0: derived from the open-file limit (max_connections_for_file_limit()).
  int64_t max_connections = 0;
};

// The default connection cap for an open-file limit: every connection is a descriptor, and the
// process keeps some for itself (model files, logs, the event loop) and for answering refused
// connections.
int64_t max_connections_for_file_limit(uint64_t open_file_limit);

class HttpServer {
 public:
  HttpServer(ServerConfig config, HandlerFn handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (an error names the address), then starts the I/O threads.
  Status start();
  uint16_t port() const { return bound_port_; }  // the real port (config port 0 = any free)

  // Draining: keep accepting (so /health can answer 503 on a new connection), but every
  // response from now on carries "Connection: close".
  void start_draining();
  // Stops all I/O (open connections are dropped) and joins the threads.
  void stop();

  int64_t open_connections() const { return open_connections_.load(); }
  int64_t max_connections() const { return max_connections_; }
  // Connections refused because max_connections were open (for /metrics and tests).
  int64_t refused_connections() const { return refused_connections_.load(); }
  bool closing() const { return closing_.load(); }
  boost::asio::io_context& io_context();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ServerConfig config_;
  HandlerFn handler_;
  uint16_t bound_port_ = 0;
  int64_t max_connections_ = 0;
  std::atomic<int64_t> open_connections_{0};
  std::atomic<int64_t> refusing_connections_{0};  // 503s still being written
  std::atomic<int64_t> refused_connections_{0};
  std::atomic<bool> closing_{false};
  std::vector<std::thread> threads_;

  friend class Session;
  friend class Acceptor;
};

}  // namespace m3::server::http
