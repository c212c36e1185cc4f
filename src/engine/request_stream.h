// Per-request event channel from the engine thread to whoever serves the request, and the handle
// submit() returns. Dropping the handle before the request is done cancels the request: a client
// that disconnects cannot leave a "ghost" request holding KV pages (anchors.md §3.5).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/request.h"

namespace m3 {

// Thread-safe FIFO of RequestEvents: one producer (the engine thread), any consumer.
class RequestStream {
 public:
  // Blocks until an event arrives or `timeout` passes (nullopt).
  std::optional<RequestEvent> next(std::chrono::milliseconds timeout);
  std::optional<RequestEvent> try_next();
  // For asynchronous servers: called on the engine thread after each push (and immediately if
  // events are already queued). Keep it cheap (post to an executor); it must not block.
  void set_notify(std::function<void()> notify);
  // True once the `done` event has been pushed (it may still be unread).
  bool done() const;

  void push(RequestEvent event);  // engine side

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  std::function<void()> notify_;
  bool done_ = false;
};

// Where handles send a cancel; lives as long as any handle or the engine (weak from handles).
class CancelSink {
 public:
  virtual ~CancelSink() = default;
  virtual void cancel(RequestId id) = 0;
};

class RequestHandle {
 public:
  RequestHandle() = default;
  RequestHandle(RequestId id, std::shared_ptr<RequestStream> stream,
                std::weak_ptr<CancelSink> sink)
      : id_(id), stream_(std::move(stream)), sink_(std::move(sink)) {}
  ~RequestHandle() { reset(); }
  RequestHandle(RequestHandle&& o) noexcept { *this = std::move(o); }
  RequestHandle& operator=(RequestHandle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      stream_ = std::move(o.stream_);
      sink_ = std::move(o.sink_);
    }
    return *this;
  }
  RequestHandle(const RequestHandle&) = delete;
  RequestHandle& operator=(const RequestHandle&) = delete;

  RequestId id() const { return id_; }
  RequestStream& stream() { return *stream_; }
  bool valid() const { return stream_ != nullptr; }
  // Cancels the request now (idempotent; no-op once done).
  void cancel() {
    if (stream_ && !stream_->done()) {
      if (auto s = sink_.lock()) s->cancel(id_);
    }
  }
  // Stops following the request WITHOUT cancelling it (e.g. handed to another owner).
  std::shared_ptr<RequestStream> release_stream() {
    sink_.reset();
    return std::move(stream_);
  }

 private:
  void reset() {
    cancel();
    stream_.reset();
    sink_.reset();
  }
  RequestId id_ = 0;
  std::shared_ptr<RequestStream> stream_;
  std::weak_ptr<CancelSink> sink_;
};

}  // namespace m3
