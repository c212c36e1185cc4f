#include "engine/request_stream.h"

namespace m3 {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

std::optional<RequestEvent> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  RequestEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

std::optional<RequestEvent> RequestStream::try_next() {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.empty()) return std::nullopt;
  RequestEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void RequestStream::set_notify(std::function<void()> notify) {
  bool pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    notify_ = notify;
    pending = !events_.empty();
  }
  if (pending && notify) notify();
}

bool RequestStream::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void RequestStream::push(RequestEvent event) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = done_ || event.done;
    events_.push_back(std::move(event));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

}  // namespace m3
