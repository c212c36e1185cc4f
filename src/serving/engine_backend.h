// InferenceBackend (server/backend.h) over the Engine (engine/engine.h): maps the server's
// sampling options onto the engine's SamplingParams (generation_config.json defaults for unset
// fields), forwards the engine's per-step events as BackendEvents on the engine thread, and
// reports the engine's stats for /metrics.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <optional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "engine/engine.h"
#include "server/backend.h"
#include "serving/engine_detokenizer.h"

namespace m3::serving {

// SamplingOptions -> SamplingParams, starting from `defaults` (Engine::default_sampling_params()).
SamplingParams to_sampling_params(const server::SamplingOptions& options,
                                  const SamplingParams& defaults);
// One engine event as the server sees it (sequence 0: the server submits one request per
// choice); with_logprobs copies each token's logprobs (BackendEvent::logprobs).
server::BackendEvent to_backend_event(const RequestEvent& event, bool with_logprobs = false);

// A vision tower: one pre-processed image -> its features, [image.num_tokens, hidden_size].
using ImageEncoder = std::function<Result<std::vector<float>>(const server::BackendImage& image)>;

class EngineBackend final : public server::InferenceBackend {
 public:
  // `keepalive` is destroyed after the engine (the checkpoint the model's weights may map).
  // `tails`: the registry the engine's detokenizer factory fills (engine_detokenizer.h); each
  // request's held-back incomplete UTF-8 tail is then flushed, as U+FFFD, into its last event.
  EngineBackend(std::unique_ptr<Engine> engine, int32_t context_length,
                std::shared_ptr<void> keepalive = nullptr,
                std::shared_ptr<DetokenizerTails> tails = nullptr);
  ~EngineBackend() override;

  bool ready() const override { return true; }  // the model is loaded before construction
  Status failure() const override { return engine_->failure(); }
  int32_t context_length() const override { return context_length_; }
  int32_t max_queued_requests() const override {
    return engine_->config().max_waiting_requests;
  }
  // Errors: the engine's invalid arguments; kResourceExhausted when the waiting queue is full
  // (429); kUnavailable when the engine is draining.
  Result<uint64_t> submit(server::BackendRequest request, server::EventCallback on_event) override;
  void cancel(uint64_t id) override;
  server::BackendStats stats() const override;

  Engine& engine() { return *engine_; }

  // Makes the backend take images: the server pre-processes them with `preprocess`, and each
  // request's images are encoded (one at a time; a few recent results are reused by content
  // hash, so the n choices of a request and repeated images run the tower once) and handed to
  // the engine as prompt embeddings. Call before serving.
  void enable_vision(server::VisionPreprocessConfig preprocess, ImageEncoder encoder);
  std::optional<server::VisionPreprocessConfig> vision() const override { return vision_; }

 private:
  struct Entry;
  void deliver(const std::shared_ptr<Entry>& entry);

  std::shared_ptr<void> keepalive_;  // declared first: destroyed last
  std::unique_ptr<Engine> engine_;
  int32_t context_length_;
  std::shared_ptr<DetokenizerTails> tails_;
  std::atomic<uint64_t> next_tag_{0};
  std::atomic<bool> closing_{false};
  std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> live_;  // requests not yet done
  // Vision (enable_vision): the encoder runs under encode_mu_, which also guards the reuse cache.
  Result<std::vector<PromptEmbeddings>> encode_images(const server::BackendRequest& request);
  std::optional<server::VisionPreprocessConfig> vision_;
  ImageEncoder encoder_;
  std::mutex encode_mu_;
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::vector<float>>>> recent_features_;
};

}  // namespace m3::serving
