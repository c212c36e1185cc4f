// Hostile input against the HTTP server in process (fake backend, real sockets): every repro of
// the hardening review gets its documented status, and the server answers /health afterwards.
#include <atomic>
#include <stdexcept>

#include "server/http/http_server.h"
#include "server/protocol/requests.h"
#include "test_client.h"

namespace m3::server {
namespace {

using namespace testing_http;

std::string nested(size_t levels) {
  return std::string(levels, '[') + std::string(levels, ']');
}

// The error object's code of a response, "" when it is not an OpenAI error.
std::string error_code(const Response& r) {
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) return "";
  const json& c = j["error"]["code"];
  return c.is_string() ? c.get<std::string>() : "";
}

void expect_healthy(uint16_t port) {
  Client c(port);
  c.send("GET", "/health");
  EXPECT_EQ(c.read().status, 200);
}

class HardeningTest : public ServerTest {};

TEST_F(HardeningTest, DeeplyNestedJsonIs400InEveryField) {
  start();
  const std::string deep = nested(100000);
  const std::string deep_string = json(deep).dump();  // the same nesting, as a JSON string
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":)" + nested(50000) + "}]}"},
      {"/v1/chat/completions", chat_body("hi", false, R"("reasoning_effort":)" + deep)},
      {"/v1/chat/completions", chat_body("hi", false, R"("thinking":{"type":)" + deep + "}")},
      {"/v1/chat/completions", chat_body("hi", false, R"("logit_bias":{"5":)" + deep + "}")},
      {"/v1/chat/completions",
       chat_body("hi", false,
                 R"("tools":[{"type":"function","function":{"name":"f","parameters":)" + deep +
                     "}}]")},
      {"/v1/chat/completions", chat_body("hi", false, R"("chat_template_kwargs":)" + deep)},
      {"/v1/completions", R"({"prompt":"hi","stop":)" + deep + "}"},
      {"/tokenize", R"({"prompt":)" + deep + "}"},
      {"/detokenize", R"({"tokens":)" + deep + "}"},
  };
  Client c(port());
  for (const auto& [path, body] : cases) {
    c.send("POST", path, body);
    Response r = c.read();
    EXPECT_EQ(r.status, 400) << path << " " << body.substr(0, 80);
    EXPECT_EQ(error_code(r), "json_too_deep") << r.body;
    EXPECT_NE(r.body.find("128"), std::string::npos) << "the message names the limit: " << r.body;
  }
  // Tool-call arguments are a JSON string inside the body: parsed separately, limited the same.
  const std::string call_args = R"({"messages":[{"role":"user","content":"x"},{"role":"assistant",
      "content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f",
      "arguments":)" + deep_string + R"(}}]}]})";
  c.send("POST", "/v1/chat/completions", call_args);
  Response r = c.read();
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(error_code(r), "json_too_deep");
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "messages[1].tool_calls[0].function.arguments");
  // At the limit, nesting is fine: the template receives it and the request is served.
  const std::string at_limit = std::string(121, '[') + "1" + std::string(121, ']');
  c.send("POST", "/v1/chat/completions",
         chat_body("hi", false,
                   R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"default":)" +
                       at_limit + "}}}}}]"));
  r = c.read();
  EXPECT_EQ(r.status, 200) << r.body;
  expect_healthy(port());
}

TEST_F(HardeningTest, RequestFaultsAre400NotInternalErrors) {
  start();
  Client c(port());
  struct Case {
    const char* path;
    std::string body;
    const char* param;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt":"hi","temperature":1e999})", ""},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":-1e999})", ""},
      {"/v1/chat/completions", chat_body("hi", false, R"("tools":[{"type":5}])"), "tools[0].type"},
      {"/v1/chat/completions", chat_body("hi", false, R"("tools":[{"type":null}])"),
       "tools[0].type"},
      {"/tokenize", R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"x"})",
       "add_generation_prompt"},
      {"/detokenize", R"({"tokens":[1,2],"skip_special_tokens":"x"})", "skip_special_tokens"},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":1e300})", "max_tokens"},
      {"/v1/completions", R"({"prompt":"hi","seed":18446744073709551615})", "seed"},
      {"/v1/completions", R"({"prompt":"hi","n":1e20})", "n"},
  };
  for (const auto& k : cases) {
    c.send("POST", k.path, k.body);
    Response r = c.read();
    EXPECT_EQ(r.status, 400) << k.path << " " << k.body << " -> " << r.body;
    json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    if (*k.param) {
      EXPECT_EQ(e["param"], k.param) << r.body;
    }
  }
  expect_healthy(port());
}

TEST_F(HardeningTest, TokenIdsNeverWrap) {
  start();
  Client c(port());
  for (const char* prompt : {"[4294967297]", "[-4294967295]", "[-1]", "[2147483648]",
                                    "[1.5]", "[[4294967297]]", "[1, \"x\"]", "[1e300]"}) {
    c.send("POST", "/v1/completions", std::string(R"({"prompt":)") + prompt + R"(,"echo":true})");
    Response r = c.read();
    EXPECT_EQ(r.status, 400) << prompt << " -> " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], "prompt") << r.body;
  }
  // In [0, INT32_MAX] but past the vocabulary: still refused, by the vocabulary bound.
  c.send("POST", "/v1/completions", R"({"prompt":[2147483647]})");
  Response r = c.read();
  EXPECT_EQ(r.status, 400) << r.body;
  for (const char* ids : {"[4294967296]", "[-1]", "[1.5]", "[\"1\"]"}) {
    c.send("POST", "/v1/completions", std::string(R"({"prompt":"hi","stop_token_ids":)") + ids + "}");
    r = c.read();
    EXPECT_EQ(r.status, 400) << ids << " -> " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], "stop_token_ids") << r.body;
  }
  for (const char* ids : {"[4294967297]", "[-1]", "[1.0]"}) {
    c.send("POST", "/detokenize", std::string(R"({"tokens":)") + ids + "}");
    r = c.read();
    EXPECT_EQ(r.status, 400) << ids << " -> " << r.body;
  }
  expect_healthy(port());
}

TEST_F(HardeningTest, LogitBiasKeysMustBeCanonical) {
  start();
  Client c(port());
  for (const char* key : {" 5", "+5", "5 ", "05", "5.0", "0x5", "1e1", "", "-0", "99999999999"}) {
    c.send("POST", "/v1/completions",
           R"({"prompt":"hi","logit_bias":{)" + json(key).dump() + R"(:1}})");
    Response r = c.read();
    EXPECT_EQ(r.status, 400) << "'" << key << "' -> " << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["param"], "logit_bias");
  }
  c.send("POST", "/v1/completions", R"({"prompt":"hi","logit_bias":{"0":1,"65":-100}})");
  EXPECT_EQ(c.read().status, 200);
}

TEST_F(HardeningTest, HeadSendsNoBody) {
  start();
  Client c(port());
  c.send("HEAD", "/health");
  std::string head = c.read_some(1);
  // Everything the server sent for the HEAD is a header block: the next response follows it.
  c.send("GET", "/health");
  std::string rest = head;
  while (rest.find("\r\n\r\n", rest.find("\r\n\r\n") + 4) == std::string::npos ||
         rest.find("{\"status\":\"ok\"}") == std::string::npos) {
    rest += c.read_some(1);
  }
  const size_t first_end = rest.find("\r\n\r\n");
  EXPECT_EQ(rest.compare(first_end + 4, 9, "HTTP/1.1 "), 0)
      << "bytes after the HEAD response's header: " << rest;
  EXPECT_NE(rest.substr(0, first_end).find("Content-Length: 15"), std::string::npos) << rest;
}

TEST_F(HardeningTest, UnadmittableChoicesAre400AndFullQueueHasRetryAfter) {
  FakeBackendOptions fo;
  fo.max_running = 4;
  fo.max_waiting = 8;
  start({}, fo);
  Client c(port());
  c.send("POST", "/v1/chat/completions", chat_body("hi", false, R"("n":12)"));
  Response r = c.read();
  EXPECT_EQ(r.status, 400) << r.body;
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "n");
  EXPECT_NE(e["message"].get<std::string>().find("8"), std::string::npos) << r.body;
  c.send("POST", "/v1/chat/completions", chat_body("hi", false, R"("n":8)"));
  EXPECT_EQ(c.read().status, 200);

  // A real 429 carries Retry-After.
  FakeBackendOptions small;
  small.max_running = 1;
  small.max_waiting = 1;
  server_.reset();
  start({}, small);
  Client a(port()), b(port()), d(port());
  a.send("POST", "/v1/chat/completions", chat_body("FAKE_INFINITE", true));
  a.read_some(10);
  b.send("POST", "/v1/chat/completions", chat_body("FAKE_INFINITE", true));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  d.send("POST", "/v1/chat/completions", chat_body("hi"));
  r = d.read();
  EXPECT_EQ(r.status, 429);
  EXPECT_NE(r.headers.find("Retry-After: 1"), std::string::npos) << r.headers;
}

// Raw bytes that must get `status` and then a closed connection.
void expect_rejected(uint16_t port, const std::string& raw, int status, const char* what) {
  Client c(port);
  c.send_raw(raw);
  Response r;
  try {
    r = c.read();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": no response (" << e.what() << ")";
    return;
  }
  EXPECT_EQ(r.status, status) << what << ": " << r.body;
  EXPECT_NE(error_code(r), "") << what << ": " << r.body;
  EXPECT_NE(r.headers.find("Connection: close"), std::string::npos) << what;
  EXPECT_TRUE(c.closed_by_peer()) << what;
}

TEST_F(HardeningTest, MalformedHttpGetsAStatusThenClose) {
  start();
  const std::string big(70 * 1024, 'a');
  expect_rejected(port(), "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n", 431,
                  "headers over 64 KiB");
  expect_rejected(port(),
                  "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                  "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                  400, "Content-Length and Transfer-Encoding");
  expect_rejected(port(),
                  "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                  "Transfer-Encoding: xchunked\r\n\r\nabc",
                  400, "xchunked with Content-Length");
  expect_rejected(port(),
                  "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n"
                  "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                  400, "xchunked alone (body length unknowable)");
  expect_rejected(port(),
                  "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n"
                  "\r\n0\r\n\r\n",
                  501, "a coding other than chunked");
  expect_rejected(port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3x\r\n\r\n",
                  400, "bad Content-Length");
  expect_rejected(port(),
                  "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                  "Content-Length: 4\r\n\r\nabcd",
                  400, "two Content-Lengths");
  expect_rejected(port(), "GET /health HTTP/1.1\nHost: x\n\n", 400, "bare LF");
  expect_rejected(port(), "GET /health HTTP/1.1\r\nHost: x\n\r\n", 400, "bare LF in a field");
  expect_rejected(port(), "GET /health\r\n", 400, "HTTP/0.9");
  expect_rejected(port(), "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "HTTP/2 preface");
  expect_rejected(port(), "GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "two Hosts");
  expect_rejected(port(), "GET /health HTTP/1.1\r\n\r\n", 400, "HTTP/1.1 without Host");
  expect_rejected(port(), "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400,
                  "a TLS hello");
  expect_healthy(port());
}

TEST_F(HardeningTest, BearerSchemeIsCaseInsensitiveAndAuthorizationSingle) {
  ServerOptions o;
  o.api_key = "sk-test";
  start(o);
  Client c(port());
  for (const char* header : {"Bearer sk-test", "bearer sk-test", "BEARER sk-test",
                             "Bearer   sk-test"}) {
    c.send("GET", "/v1/models", "", std::string("Authorization: ") + header + "\r\n");
    EXPECT_EQ(c.read().status, 200) << header;
  }
  for (const char* header : {"Bearer sk-tes", "Basic sk-test", "Bearersk-test", "sk-test",
                             "Bearer: sk-test"}) {
    c.send("GET", "/v1/models", "", std::string("Authorization: ") + header + "\r\n");
    EXPECT_EQ(c.read().status, 401) << header;
  }
  expect_rejected(port(),
                  "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
                  "Authorization: Bearer sk-test\r\n\r\n",
                  400, "two Authorization headers");
}

TEST_F(HardeningTest, ConnectionsPastTheCapGet503AndClose) {
  ServerOptions o;
  o.max_connections = 3;
  start(o);
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<Client>(port()));
    held.back()->send("GET", "/health");
    ASSERT_EQ(held.back()->read().status, 200);
  }
  Client extra(port());
  Response r = extra.read();
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(error_code(r), "too_many_connections");
  EXPECT_NE(r.headers.find("Retry-After"), std::string::npos);
  EXPECT_TRUE(extra.closed_by_peer());
  held[0]->send("GET", "/metrics");
  Response m = held[0]->read();
  EXPECT_NE(m.body.find("m3serve:http_connections_refused_total{model_name=\"m3-tiny\"} 1"),
            std::string::npos)
      << m.body;
  held.pop_back();  // a slot frees when a connection closes
  for (int i = 0; i < 100; ++i) {
    Client again(port());
    again.send("GET", "/health");
    Response a = again.read();
    if (a.status == 200) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "no connection was served after one closed";
}

TEST_F(HardeningTest, IdleConnectionsCloseAfterTheKeepAliveTimeout) {
  ServerOptions o;
  o.keep_alive_timeout = std::chrono::milliseconds(200);
  start(o);
  Client c(port());
  c.send("GET", "/health");
  EXPECT_EQ(c.read().status, 200);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(c.closed_by_peer());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  // A header trickled in slower than the timeout is cut off too (slowloris).
  Client slow(port());
  slow.send_raw("GET /health HTTP/1.1\r\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_TRUE(slow.closed_by_peer());
}

TEST(ConnectionCap, DerivedFromTheFileLimit) {
  EXPECT_EQ(http::max_connections_for_file_limit(128), 64);
  EXPECT_EQ(http::max_connections_for_file_limit(1024), 960);
  EXPECT_EQ(http::max_connections_for_file_limit(10), 8);
  EXPECT_EQ(http::max_connections_for_file_limit(UINT64_MAX), 100000);
}

// A codec that fails with an exception whose text must not reach the client.
class ThrowingCodec : public FakeCodec {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    if (text.find("explode") != std::string_view::npos) {
      throw std::runtime_error("secret internal detail /etc/m3/key");
    }
    return FakeCodec::encode(text);
  }
};

TEST(InternalErrors, A500CarriesNoExceptionText) {
  FakeBackend backend(FakeBackendOptions{});
  ThrowingCodec codec;
  FakeRenderer renderer;
  ServerOptions opt;
  opt.host = "127.0.0.1";
  opt.port = 0;
  opt.served_model_names = {"m3-tiny"};
  Server server(opt, &backend, &codec, &renderer);
  ASSERT_TRUE(server.start().is_ok());
  Client c(server.port());
  c.send("POST", "/v1/completions", R"({"prompt":"explode"})");
  Response r = c.read();
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.body.find("secret"), std::string::npos) << r.body;
  EXPECT_EQ(error_code(r), "internal_error");
  c.send("GET", "/health");
  EXPECT_EQ(c.read().status, 200);
}

}  // namespace
}  // namespace m3::server
