// The HTTP server in process, against the fake backend, over real sockets: keep-alive, 401/404/
// 413/429/503, client disconnects cancelling generation (streaming and not), draining.
#include "test_client.h"

namespace m3::server {
namespace {

using namespace testing_http;

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
                                                        {"GET", "/version"},
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

// vLLM's GET /version: the version the server was given; POST is 405.
TEST_F(ServerTest, VersionRoute) {
  ServerOptions o;
  o.version = "9.8.7";
  start(o);
  Client c(port());
  c.send("GET", "/version");
  Response r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["version"], "9.8.7");
  c.send("POST", "/version", "{}");
  EXPECT_EQ(c.read().status, 405);
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
  // Joined on every path: a failed read (an exception) must report, not std::terminate.
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{drainer};
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  b.send("POST", "/v1/chat/completions", chat_body("hi"));
  Response rb = b.read();
  EXPECT_EQ(rb.status, 503);
  EXPECT_EQ(json::parse(rb.body)["error"]["code"], "draining");
  Response ra = a.read();
  EXPECT_EQ(ra.status, 200);
  EXPECT_EQ(json::parse(ra.body)["choices"][0]["message"]["content"],
            "Hello from the fake backend.");
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
