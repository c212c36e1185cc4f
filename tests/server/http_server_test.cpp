// The HTTP server in process, against the fake backend, over real sockets: keep-alive, 401/404/
// 413/429/503, client disconnects cancelling generation (streaming and not), draining.
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
namespace {

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

std::string b64(const std::string& in) {
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

std::string chat_body(const std::string& user, bool stream = false, const std::string& extra = "") {
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

TEST_F(ServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  start();
  Client c(port());
  for (int i = 0; i < 3; ++i) {
    c.send("POST", "/v1/chat/completions", chat_body("hi"));
    Response r = c.read();
    ASSERT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello from the fake backend.");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  }
  c.send("GET", "/health");
  EXPECT_EQ(c.read().status, 200);
}

TEST_F(ServerTest, ApiKeyCoversEveryRouteButHealth) {
  ServerOptions o;
  o.api_key = "sk-test";
  start(o);
  Client c(port());
  for (auto [method, path] :
       std::vector<std::pair<std::string, std::string>>{{"GET", "/v1/models"},
                                                        {"GET", "/metrics"},
                                                        {"POST", "/v1/chat/completions"},
                                                        {"POST", "/v1/completions"},
                                                        {"POST", "/tokenize"},
                                                        {"POST", "/detokenize"},
                                                        {"GET", "/health_generate"},
                                                        {"GET", "/v1/models/m3-tiny"},
                                                        {"GET", "/nope"}}) {
    c.send(method, path, method == "POST" ? chat_body("x") : "");
    Response r = c.read();
    EXPECT_EQ(r.status, 401) << path;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "invalid_api_key");
  }
  c.send("GET", "/health");
  EXPECT_EQ(c.read().status, 200);
  c.send("GET", "/metrics", "", "Authorization: Bearer sk-test\r\n");
  Response m = c.read();
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("m3serve:num_requests_running"), std::string::npos);
}

TEST_F(ServerTest, ErrorStatuses) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  o.context_length = 400;
  start(o);
  {
    Client c(port());
    c.send("GET", "/v1/unknown");
    EXPECT_EQ(c.read().status, 404);
    c.send("POST", "/v1/chat/completions",
           R"({"model":"other","messages":[{"role":"user","content":"x"}]})");
    Response r = c.read();
    EXPECT_EQ(r.status, 404);
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "model_not_found");
    c.send("POST", "/v1/chat/completions", "{not json");
    EXPECT_EQ(c.read().status, 400);
    c.send("GET", "/v1/chat/completions");
    EXPECT_EQ(c.read().status, 405);
    // Prompt + max_tokens over the context: both numbers in the message.
    c.send("POST", "/v1/chat/completions", chat_body("x", false, R"("max_tokens":390)"));
    r = c.read();
    EXPECT_EQ(r.status, 400);
    std::string msg = json::parse(r.body)["error"]["message"];
    EXPECT_NE(msg.find("400 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("390 in the completion"), std::string::npos) << msg;
  }
  {
    Client c(port());
    c.send("POST", "/v1/chat/completions", chat_body(std::string(5000, 'a')));
    Response r = c.read();
    EXPECT_EQ(r.status, 413);
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "request_too_large");
  }
}

TEST_F(ServerTest, QueueFullIs429) {
  FakeBackendOptions fo;
  fo.max_running = 1;
  fo.max_waiting = 1;
  start({}, fo);
  Client a(port()), b(port()), c(port());
  a.send("POST", "/v1/chat/completions", chat_body("FAKE_INFINITE", true));
  a.read_some(10);  // running
  b.send("POST", "/v1/chat/completions", chat_body("FAKE_INFINITE", true));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // queued
  c.send("POST", "/v1/chat/completions", chat_body("hi"));
  Response r = c.read();
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "queue_full");
}

TEST_F(ServerTest, LoadingIs503) {
  FakeBackendOptions fo;
  fo.ready_after = std::chrono::milliseconds(100000);
  start({}, fo);
  Client c(port());
  c.send("GET", "/health");
  EXPECT_EQ(c.read().status, 503);
  c.send("POST", "/v1/chat/completions", chat_body("hi"));
  Response r = c.read();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "loading");
}

TEST_F(ServerTest, StreamingDisconnectCancelsWithinAStep) {
  start();
  Client c(port());
  c.send("POST", "/v1/chat/completions", chat_body("FAKE_INFINITE FAKE_STEP_MS=5", true));
  std::string got = c.read_some(200);
  EXPECT_NE(got.find("text/event-stream"), std::string::npos);
  c.close();
  EXPECT_TRUE(wait_cancelled(1));
}

TEST_F(ServerTest, NonStreamingDisconnectCancels) {
  start();
  Client c(port());
  c.send("POST", "/v1/chat/completions", chat_body("FAKE_INFINITE FAKE_STEP_MS=5", false));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(backend_->stats().num_requests_running, 1);
  c.close();
  EXPECT_TRUE(wait_cancelled(1));
  for (int i = 0; i < 100 && backend_->stats().num_requests_running; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend_->stats().num_requests_running, 0);
}

TEST_F(ServerTest, DrainFinishesInFlightAndRefusesNew) {
  start();
  Client a(port());
  // About 30 tokens at 10 ms a step: finishes during the drain.
  a.send("POST", "/v1/chat/completions", chat_body("FAKE_STEP_MS=10", false));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  Client b(port());  // connected (and accepted: one request served) before the drain
  b.send("GET", "/health");
  ASSERT_EQ(b.read().status, 200);
  std::thread drainer([&] { EXPECT_TRUE(server_->drain()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  b.send("POST", "/v1/chat/completions", chat_body("hi"));
  Response rb = b.read();
  EXPECT_EQ(rb.status, 503);
  EXPECT_EQ(json::parse(rb.body)["error"]["code"], "draining");
  Response ra = a.read();
  EXPECT_EQ(ra.status, 200);
  EXPECT_EQ(json::parse(ra.body)["choices"][0]["message"]["content"],
            "Hello from the fake backend.");
  drainer.join();
}

TEST_F(ServerTest, ImagesGetA400NotACrash) {
  start();
  Client c(port());
  std::string png = std::string("\x89PNG\r\n\x1a\n", 8) + std::string(16, '\0');
  json body = {{"messages",
                {{{"role", "user"},
                  {"content",
                   {{{"type", "text"}, {"text", "what is this"}},
                    {{"type", "image_url"},
                     {"image_url", {{"url", "data:image/png;base64," + b64(png)}}}}}}}}}};
  c.send("POST", "/v1/chat/completions", body.dump());
  Response r = c.read();
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "vision_not_available");
  body["messages"][0]["content"][1]["image_url"]["url"] = "http://169.254.169.254/latest/meta-data";
  c.send("POST", "/v1/chat/completions", body.dump());
  r = c.read();
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "media_domain_not_allowed");
}

TEST_F(ServerTest, ExpectContinue) {
  start();
  Client c(port());
  std::string body = chat_body("hi");
  c.send_raw(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n");
  std::string cont = c.read_some(10);
  EXPECT_NE(cont.find("100 Continue"), std::string::npos);
  c.send_raw(body);
  EXPECT_EQ(c.read().status, 200);
}

}  // namespace
}  // namespace m3::server
