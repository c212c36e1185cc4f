// libFuzzer target for the whole HTTP front door, in process: raw bytes as a client would send
// them on one connection go through Beast's request parser and the server's own header checks
// (server/http/request_parsing.h, as the connection does), then every request that parses runs
// through the router, the protocol layer and the handlers against the fake backend
// (server/handlers/routes.h). Pipelined requests on the same bytes are served in turn.
//
// Invariants, beyond no crash, leak or sanitizer report:
// - a refusal at the HTTP level has a status (400/413/431/501) and a well-formed response;
// - every response has an expected status, and every error body is an OpenAI error object;
// - no handler throws (the 500 "failed to process the request" never appears): every bad input
//   is classified as the client's fault;
// - JSON responses parse; a stream is "data: <json>\n\n" events ending in "data: [DONE]";
// - every generation job ends: the server's in-flight count returns to zero.
#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/fake/fake_backend.h"
#include "server/fake/fake_codec.h"
#include "server/fake/fake_renderer.h"
#include "server/handlers/context.h"
#include "server/handlers/routes.h"
#include "server/http/request_parsing.h"

namespace {

namespace net = boost::asio;
using namespace m3::server;
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& why, const std::string& detail) {
  std::fprintf(stderr, "http_front_door_fuzz: %s\n%s\n", why.c_str(), detail.substr(0, 2000).c_str());
  std::abort();
}

// The connection's strand: responders run their callbacks on one thread, as a connection does.
struct Strand {
  net::io_context ioc;
  net::executor_work_guard<net::io_context::executor_type> work = net::make_work_guard(ioc);
  std::thread thread{[this] { ioc.run(); }};
};

class CapturingResponder : public http::Responder {
 public:
  explicit CapturingResponder(net::io_context& ioc) : ioc_(ioc) {}

  void send(int status, std::string content_type, std::string body, http::Headers) override {
    std::lock_guard lock(mu_);
    if (started_) return;
    started_ = done_ = true;
    status_ = status;
    content_type_ = std::move(content_type);
    body_ = std::move(body);
    cv_.notify_all();
  }
  void start_stream(http::Headers) override {
    std::lock_guard lock(mu_);
    if (started_) return;
    started_ = streaming_ = true;
    status_ = 200;
  }
  void send_event(std::string event) override {
    std::lock_guard lock(mu_);
    if (streaming_ && !done_) body_ += event;
  }
  void end_stream() override {
    std::lock_guard lock(mu_);
    if (!streaming_) return;
    done_ = true;
    cv_.notify_all();
  }
  bool disconnected() const override {
    std::lock_guard lock(mu_);
    return gone_;
  }
  void on_disconnect(std::function<void()> fn) override {
    post([this, fn = std::move(fn)]() mutable {
      bool now;
      {
        std::lock_guard lock(mu_);
        now = gone_;
        if (!now) callbacks_.push_back(std::move(fn));
      }
      if (now) fn();
    });
  }
  void post(std::function<void()> fn) override { net::post(ioc_, std::move(fn)); }

  // The client goes away: what a closed socket does to a request still running.
  void disconnect() {
    post([this] {
      std::vector<std::function<void()>> fns;
      {
        std::lock_guard lock(mu_);
        gone_ = true;
        fns.swap(callbacks_);
      }
      for (auto& f : fns) f();
    });
  }
  bool wait_done(std::chrono::milliseconds ms) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, ms, [this] { return done_; });
  }

  void check(const std::string& request) const {
    std::lock_guard lock(mu_);
    if (!done_) return;  // cut off by the disconnect: nothing more was owed
    static const int kStatuses[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
    if (std::find(std::begin(kStatuses), std::end(kStatuses), status_) == std::end(kStatuses)) {
      fail("unexpected status " + std::to_string(status_), request);
    }
    if (streaming_) return check_stream(request);
    const bool is_json = content_type_.rfind("application/json", 0) == 0;
    json j = is_json ? json::parse(body_, nullptr, false) : json();
    if (is_json && j.is_discarded()) fail("a JSON response does not parse", body_);
    if (status_ >= 400) check_error(j, request);
  }

 private:
  void check_error(const json& j, const std::string& request) const {
    if (!j.is_object() || !j.contains("error") || !j["error"].is_object() ||
        !j["error"].contains("message") || !j["error"]["message"].is_string() ||
        !j["error"].contains("type") || !j["error"]["type"].is_string()) {
      fail("an error response is not an OpenAI error object", body_ + "\nfor\n" + request);
    }
    const std::string& msg = j["error"]["message"].get_ref<const std::string&>();
    if (status_ == 500 && msg.rfind("Generation failed", 0) != 0) {
      fail("a handler threw (500): " + msg, request);
    }
  }
  void check_stream(const std::string& request) const {
    size_t pos = 0;
    bool ended = false;
    while (pos < body_.size()) {
      if (ended) fail("an event after data: [DONE]", body_);
      if (body_.compare(pos, 6, "data: ") != 0) fail("a stream event without 'data: '", body_);
      const size_t end = body_.find("\n\n", pos);
      if (end == std::string::npos) fail("a stream event without its blank line", body_);
      const std::string payload = body_.substr(pos + 6, end - pos - 6);
      if (payload == "[DONE]") {
        ended = true;
      } else {
        json j = json::parse(payload, nullptr, false);
        if (j.is_discarded()) fail("a stream event is not JSON", payload);
        if (j.contains("error")) check_error(j, request);
      }
      pos = end + 2;
    }
    if (!ended) fail("a finished stream without data: [DONE]", body_ + "\nfor\n" + request);
  }

  net::io_context& ioc_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, streaming_ = false, done_ = false, gone_ = false;
  int status_ = 0;
  std::string content_type_, body_;
  std::vector<std::function<void()>> callbacks_;
};

struct FrontDoor {
  FakeBackend backend{[] {
    FakeBackendOptions o;
    o.context_length = 4096;
    o.max_running = 8;
    o.max_waiting = 8;
    o.step_ms = 0;
    o.tokens_per_step = 16;
    return o;
  }()};
  FakeCodec codec;
  FakeRenderer renderer;
  boost::asio::thread_pool workers{2};
  ServerContext ctx;
  Strand strand;

  FrontDoor() {
    ctx.options.served_model_names = {"m3-tiny"};
    ctx.options.max_body_bytes = 1 << 20;
    ctx.backend = &backend;
    ctx.codec = &codec;
    ctx.renderer = &renderer;
    ctx.metrics = std::make_unique<Metrics>("m3-tiny");
    ctx.workers = &workers;
    ctx.open_connections = [] { return int64_t{1}; };
  }

  void serve(http::Request&& request, const std::string& raw) {
    auto responder = std::make_shared<CapturingResponder>(strand.ioc);
    handle_request(ctx, std::move(request), responder);
    // Scripted outputs end within milliseconds; a long or endless one is ended by the client
    // going away, as a real client's timeout would.
    if (!responder->wait_done(std::chrono::milliseconds(200))) responder->disconnect();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    responder->wait_done(std::chrono::milliseconds(50));
    while (ctx.in_flight.load() > 0) {
      if (std::chrono::steady_clock::now() > deadline) fail("a generation job never ended", raw);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    responder->check(raw);
  }
};

FrontDoor& front_door() {
  static FrontDoor* d = new FrontDoor();  // lives for the process: its threads never stop
  return *d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  std::string_view rest = raw;
  // Up to four pipelined requests per input, parsed the way a connection reads them: the
  // header first (checked before any body byte is read), then the body.
  for (int n = 0; n < 4 && !rest.empty(); ++n) {
    http::RequestParser parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(front_door().ctx.options.max_body_bytes);
    boost::beast::error_code ec;
    bool checked = false;
    while (!parser.is_done()) {
      const size_t used = parser.put(net::buffer(rest.data(), rest.size()), ec);
      rest.remove_prefix(used);
      if (ec == boost::beast::http::error::need_more) return 0;  // the client stopped mid-way
      if (ec) {
        if (http::read_error_status(ec) == 0) fail("a parse error with no status: " + ec.message(), raw);
        const std::string response = http::rejection_response(
            {http::read_error_status(ec), "Malformed HTTP request: " + ec.message() + "."});
        if (response.rfind("HTTP/1.1 4", 0) != 0) fail("a rejection that is not a 4xx", response);
        return 0;  // the connection closes after a rejection
      }
      if (parser.is_header_done() && !checked) {
        checked = true;
        if (auto rejection = http::check_request_header(parser)) {
          if (rejection->status != 400 && rejection->status != 501) {
            fail("a header rejection with status " + std::to_string(rejection->status), raw);
          }
          return 0;
        }
      }
      if (used == 0 && !parser.is_done()) return 0;  // nothing more to parse
    }
    const bool keep_alive = parser.get().keep_alive();
    front_door().serve(http::to_request(parser.release()), raw);
    if (!keep_alive) break;
  }
  return 0;
}
