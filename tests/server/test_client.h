// In-process test helpers for the HTTP server over the fake backend: a blocking HTTP/1.1 client
// (Content-Length and chunked bodies), SSE parsing, and a fixture that starts a Server.
#pragma once

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/fake/fake_backend.h"
#include "server/fake/fake_codec.h"
#include "server/fake/fake_renderer.h"
#include "server/media/media_policy.h"
#include "server/server.h"

namespace m3::server {
namespace testing_http {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using json = nlohmann::ordered_json;

struct Response {
  int status = 0;
  std::string headers;
  std::string body;
};

class Client {
 public:
  explicit Client(uint16_t port) : socket_(ioc_) {
    socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  }
  void send_raw(const std::string& s) { net::write(socket_, net::buffer(s)); }
  void send(const std::string& method, const std::string& path, const std::string& body = "",
            const std::string& extra_headers = "") {
    send_raw(method + " " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
             extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  // Reads one complete response (Content-Length or chunked).
  Response read() {
    Response r;
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) fill();
    r.headers = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    r.status = std::stoi(r.headers.substr(9, 3));
    std::string lower = r.headers;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (size_t p = lower.find("content-length: "); p != std::string::npos) {
      size_t n = std::stoul(lower.substr(p + 16));
      while (buf_.size() < n) fill();
      r.body = buf_.substr(0, n);
      buf_.erase(0, n);
    } else {
      while (true) {
        size_t crlf;
        while ((crlf = buf_.find("\r\n")) == std::string::npos) fill();
        size_t n = std::stoul(buf_.substr(0, crlf), nullptr, 16);
        while (buf_.size() < crlf + 2 + n + 2) fill();
        r.body += buf_.substr(crlf + 2, n);
        buf_.erase(0, crlf + 2 + n + 2);
        if (n == 0) break;
      }
    }
    return r;
  }
  // Reads at least `n` more bytes of whatever arrives.
  std::string read_some(size_t n) {
    while (buf_.size() < n) fill();
    return std::exchange(buf_, "");
  }
  void close() {
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }
  bool closed_by_peer() {
    boost::system::error_code ec;
    char c;
    socket_.read_some(net::buffer(&c, 1), ec);
    return ec == net::error::eof || ec == net::error::connection_reset;
  }

 private:
  void fill() {
    char tmp[4096];
    size_t n = socket_.read_some(net::buffer(tmp));
    buf_.append(tmp, n);
  }
  net::io_context ioc_;
  tcp::socket socket_;
  std::string buf_;
};

inline std::string b64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -6;
  for (unsigned char c : in) {
    val = (val << 8) + c;
    bits += 8;
    while (bits >= 0) {
      out += t[(val >> bits) & 63];
      bits -= 6;
    }
  }
  if (bits > -6) out += t[((val << 8) >> (bits + 8)) & 63];
  while (out.size() % 4) out += '=';
  return out;
}

inline std::string chat_body(const std::string& user, bool stream = false,
                             const std::string& extra = "") {
  json b = {{"model", "m3-tiny"},
            {"messages", json::array({{{"role", "user"}, {"content", user}}})},
            {"stream", stream}};
  std::string s = b.dump();
  if (!extra.empty()) s = s.substr(0, s.size() - 1) + "," + extra + "}";
  return s;
}

class ServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions opt = {}, FakeBackendOptions fo = {}) {
    opt.host = "127.0.0.1";
    opt.port = 0;
    if (opt.served_model_names.empty()) opt.served_model_names = {"m3-tiny"};
    backend_ = std::make_unique<FakeBackend>(fo);
    server_ = std::make_unique<Server>(opt, backend_.get(), &codec_, &renderer_);
    ASSERT_TRUE(server_->start().is_ok());
  }
  void TearDown() override {
    server_.reset();
    backend_.reset();
  }
  uint16_t port() { return server_->port(); }
  // Waits up to 2 s for the fake backend to have cancelled `n` requests.
  bool wait_cancelled(uint64_t n) {
    for (int i = 0; i < 200; ++i) {
      if (backend_->cancelled_total() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  FakeCodec codec_;
  FakeRenderer renderer_;
  std::unique_ptr<FakeBackend> backend_;
  std::unique_ptr<Server> server_;
};

// The JSON payloads of an SSE body's "data:" lines, without the final [DONE] (which must be
// there: `done` tells).
inline std::vector<json> sse_events(const std::string& body, bool* done = nullptr) {
  std::vector<json> out;
  size_t pos = 0;
  if (done) *done = false;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    size_t end = body.find("\n\n", pos);
    std::string payload = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      if (done) *done = true;
      continue;
    }
    out.push_back(json::parse(payload));
  }
  return out;
}

}  // namespace testing_http
}  // namespace m3::server
