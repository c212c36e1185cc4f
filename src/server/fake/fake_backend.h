// A scripted InferenceBackend for tests and `m3serve serve --fake-backend`: it behaves like the
// engine from the server's side (queueing, continuous batching, steps with several tokens,
// detokenized UTF-8-safe text, stop strings, EOS, max_tokens, cancellation at the next step, a
// prefix cache that reports cached_tokens) but "generates" a text chosen by the prompt.
//
// Directives anywhere in the prompt (the last occurrence wins), so a test can script the model
// output through an ordinary chat request:
//   FAKE_OUTPUT_B64=<base64>   the output text (special-token strings become single tokens)
//   FAKE_TPS=<k>               tokens per step (as speculative decoding would accept)
//   FAKE_STEP_MS=<n>           time between steps of this request
//   FAKE_INFINITE              never ends by itself (until max_tokens or cancel)
//   FAKE_ERROR                 fails with an error event after the first step
//   FAKE_ECHO_SEED             the output is "seed <the request's seed>" (or "seed none")
// With logprobs asked for, each token gets a made-up distribution in which it is the most likely.
// Without FAKE_OUTPUT_B64 the output is "Hello from the fake backend." and EOS.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "server/backend.h"
#include "server/fake/fake_codec.h"

namespace m3::server {

struct FakeBackendOptions {
  int32_t context_length = 8192;
  // Set: the fake model "takes images" (InferenceBackend::vision) with this pre-processing.
  std::optional<VisionPreprocessConfig> vision;
  int32_t max_running = 256;
  int32_t max_waiting = 1024;
  int32_t step_ms = 2;
  int32_t tokens_per_step = 1;
  std::chrono::milliseconds ready_after{0};  // /health is 503 until then
  int32_t kv_pages_total = 4096;
};

class FakeBackend : public InferenceBackend {
 public:
  explicit FakeBackend(FakeBackendOptions options = {});
  ~FakeBackend() override;

  bool ready() const override;
  int32_t context_length() const override { return options_.context_length; }
  int32_t max_queued_requests() const override { return options_.max_waiting; }
  std::optional<VisionPreprocessConfig> vision() const override { return options_.vision; }
  Result<uint64_t> submit(BackendRequest request, EventCallback on_event) override;
  void cancel(uint64_t id) override;
  BackendStats stats() const override;

  uint64_t cancelled_total() const { return cancelled_total_.load(); }
  // The last request submitted (its tokens and images), for tests.
  BackendRequest last_request() const;

 private:
  struct Req;
  void loop();
  BackendEvent step_request(Req& r, Clock::time_point now);

  FakeBackendOptions options_;
  FakeCodec codec_;
  Clock::time_point created_ = Clock::now();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Req>> waiting_;
  std::map<uint64_t, std::unique_ptr<Req>> running_;
  std::vector<uint64_t> cancels_;
  std::vector<int32_t> last_prompt_;  // for the fake prefix cache
  BackendRequest last_request_;
  uint64_t next_id_ = 1;
  uint64_t prefix_hits_ = 0;
  bool stop_ = false;
  std::atomic<uint64_t> cancelled_total_{0};
  std::thread thread_;
};

}  // namespace m3::server
