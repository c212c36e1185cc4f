// Forwarding a request to a worker: selection, retries before the first response byte, SSE
// pass-through event by event, and cancellation when the client goes away.
// clang-format off
#include <utility>  // before Asio (Boost 1.74's awaitable.hpp misses it)
// clang-format on
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <mutex>
#include <set>

#include "router/router.h"
#include "router/routing_text.h"
#include "router/upstream_client.h"
#include "server/protocol/errors.h"

namespace m3::router {

namespace net = boost::asio;

namespace {

// Statuses a worker answers when it cannot take the request now (overloaded gateway, draining,
// timeout): another worker may.
bool retryable_status(int status) {
  return status == 502 || status == 503 || status == 504;
}

// Passes an SSE stream on whole events: every complete event ("...\n\n") goes out as soon as it
// is in, and a partial one waits for its end. Thus an error event added after a failure never
// lands inside a half-sent event.
class EventForwarder {
 public:
  // Returns the bytes to send now (possibly empty).
  std::string feed(std::string_view bytes) {
    pending_.append(bytes);
    size_t cut = pending_.rfind("\n\n");
    cut = cut == std::string::npos ? 0 : cut + 2;
    if (const size_t crlf = pending_.rfind("\r\n\r\n"); crlf != std::string::npos) {
      cut = std::max(cut, crlf + 4);
    }
    // An event this large is not held back any longer (a worker's events are small).
    if (pending_.size() > kMaxHeld) cut = pending_.size();
    std::string out = pending_.substr(0, cut);
    pending_.erase(0, cut);
    return out;
  }
  std::string rest() { return std::exchange(pending_, {}); }

 private:
  static constexpr size_t kMaxHeld = 1u << 20;
  std::string pending_;
};

// What the client's disconnect callback (on the connection's strand) and the proxy coroutine
// (on its own strand) share.
struct CallSlot {
  std::mutex mu;
  bool client_gone = false;
  std::shared_ptr<UpstreamCall> call;
};

constexpr size_t kMaxBufferedBody = 256u << 20;  // a non-streamed response held for a retry

}  // namespace

net::awaitable<void> Router::proxy(Request req, std::shared_ptr<Responder> responder) {
  ++requests_total_;
  const bool generation = req.path == "/v1/chat/completions" || req.path == "/v1/completions";
  const std::string text = generation ? routing_text(req.path, req.body) : std::string();
  auto slot = std::make_shared<CallSlot>();
  responder->on_disconnect([slot] {
    std::lock_guard<std::mutex> lock(slot->mu);
    slot->client_gone = true;
    if (slot->call) slot->call->cancel();
  });
  auto strand = co_await net::this_coro::executor;

  UpstreamRequest up;
  up.method = req.method;
  up.body = req.body;
  up.content_type = req.header("content-type");
  up.authorization = req.header("authorization");
  up.timeout_s = flags_.request_timeout_s;

  std::set<uint64_t> tried;
  std::string last_error;
  int last_status = 0;  // a retryable HTTP answer, passed on if no other worker does better
  std::string last_body, last_content_type;
  for (int attempt = 0; attempt < flags_.max_attempts; ++attempt) {
    std::vector<Candidate> candidates;
    std::vector<std::shared_ptr<Worker>> pool = workers_.all();
    for (const auto& w : pool) {
      if (w->healthy.load() && tried.count(w->id) == 0) {
        candidates.push_back({w->id, w->in_flight.load(), w->requests_total.load()});
      }
    }
    if (candidates.empty()) break;
    Selection sel;
    if (generation) {
      sel = policy_->select(text, candidates);
    } else {
      sel.worker_id = candidates[least_loaded(candidates)].worker_id;
    }
    std::shared_ptr<Worker> worker = workers_.find(sel.worker_id);
    if (!worker) {  // removed meanwhile
      tried.insert(sel.worker_id);
      continue;
    }
    tried.insert(worker->id);
    if (attempt > 0) ++retries_total_;
    if (generation && sel.text_bytes > 0) {
      worker->matched_bytes_total += sel.matched_bytes;
      worker->text_bytes_total += sel.text_bytes;
      ++(sel.by_cache ? cache_routed_total_ : load_routed_total_);
    }
    ++worker->requests_total;
    ++worker->in_flight;
    struct InFlight {
      Worker* w;
      ~InFlight() { --w->in_flight; }
    } in_flight_guard{worker.get()};

    // A worker URL with a path (http://host/prefix) serves the API under it.
    up.target = worker->endpoint.path_prefix + req.target;
    auto call = std::make_shared<UpstreamCall>(strand);
    {
      std::lock_guard<std::mutex> lock(slot->mu);
      if (slot->client_gone) co_return;
      slot->call = call;
    }
    const server::http::Headers headers = {{"X-M3serve-Worker", worker->url}};
    bool streaming = false;  // the stream is the client's from its header on: no retry after
    bool retry_answer = false;
    std::string body;
    bool body_too_large = false;
    EventForwarder events;
    UpstreamOutcome outcome = co_await call->run(
        worker->endpoint, up,
        [&](const UpstreamOutcome& head) {
          if (retryable_status(head.status)) {
            retry_answer = true;
            return;
          }
          if (head.status == 200 && head.content_type.rfind("text/event-stream", 0) == 0) {
            streaming = true;
            responder->start_stream(headers);
          }
        },
        [&](std::string_view bytes) {
          if (streaming) {
            std::string out = events.feed(bytes);
            if (!out.empty()) responder->send_event(std::move(out));
          } else if (body_too_large || body.size() + bytes.size() > kMaxBufferedBody) {
            body_too_large = true;
            body.clear();
          } else {
            body.append(bytes);
          }
        });
    {
      std::lock_guard<std::mutex> lock(slot->mu);
      slot->call.reset();
      if (slot->client_gone) co_return;  // the worker saw its connection close and cancels
    }
    if (streaming) {
      if (outcome.transport.empty()) {
        std::string rest = events.rest();
        if (!rest.empty()) responder->send_event(std::move(rest));
      } else {
        // After the first byte the response is the client's: end it with an error event.
        ++worker->errors_total;
        events.rest();  // a partial event is dropped
        server::ApiError e = server::unavailable(
            "The worker " + worker->url + " failed mid-stream: " + outcome.transport,
            "worker_failed");
        e.status = 502;
        e.type = "server_error";
        responder->send_event("data: " + e.body() + "\n\n");
      }
      responder->end_stream();
      co_return;
    }
    if (body_too_large) {
      // Another worker would answer as much: refuse rather than pass on a cut body.
      server::ApiError e = server::unavailable(
          "The response of " + worker->url + " is larger than the router's limit of " +
              std::to_string(kMaxBufferedBody) + " bytes for an unstreamed response; stream it.",
          "response_too_large");
      e.status = 502;
      responder->send(e.status, "application/json", e.body(), headers);
      co_return;
    }
    if (outcome.transport.empty() && !retry_answer) {
      responder->send(outcome.status, outcome.content_type.empty() ? "application/json"
                                                                   : outcome.content_type,
                      std::move(body), headers);
      co_return;
    }
    // Nothing reached the client yet: try another worker.
    ++worker->failures_total;
    if (retry_answer && outcome.transport.empty()) {
      last_status = outcome.status;
      last_body = std::move(body);
      last_content_type = outcome.content_type;
      last_error = worker->url + " answered HTTP " + std::to_string(outcome.status);
    } else {
      last_error = worker->url + ": " + outcome.transport;
      // No answer at all (refused, reset): out of the pool until a probe succeeds.
      if (outcome.status == 0) worker->healthy.store(false);
    }
    std::fprintf(stderr, "m3serve router: attempt %d failed (%s)%s\n", attempt + 1,
                 last_error.c_str(), attempt + 1 < flags_.max_attempts ? "; retrying" : "");
  }
  if (last_status != 0) {
    responder->send(last_status,
                    last_content_type.empty() ? "application/json" : last_content_type,
                    std::move(last_body));
    co_return;
  }
  ++no_worker_total_;
  server::ApiError e =
      last_error.empty()
          ? server::unavailable("No healthy worker can take the request.", "no_available_workers")
          : server::unavailable("Every attempt failed; the last: " + last_error, "worker_failed");
  if (!last_error.empty()) e.status = 502;
  responder->send(e.status, "application/json", e.body());
}

}  // namespace m3::router
