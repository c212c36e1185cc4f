// The model behind the server, installed after the HTTP server is already listening: `serve`
// binds the port first and loads the checkpoint in the background, so /health answers 503
// ("loading") instead of the connection being refused. Until install(), generation, /tokenize
// and /detokenize get 503 (kUnavailable); afterwards every call goes to the real components.
#pragma once

#include <atomic>
#include <memory>

#include "server/backend.h"
#include "server/model_frontend.h"

namespace m3::server {

// What a model factory builds (serve_command.h).
struct ModelStack {
  std::unique_ptr<InferenceBackend> backend;
  std::unique_ptr<TextCodec> codec;
  std::unique_ptr<ChatRenderer> renderer;
};

class DeferredModel {
 public:
  DeferredModel();
  ~DeferredModel();

  InferenceBackend* backend() { return backend_.get(); }
  const TextCodec* codec() const { return codec_.get(); }
  const ChatRenderer* renderer() const { return renderer_.get(); }

  // Thread-safe; once. The stack lives as long as this object.
  void install(ModelStack stack);
  bool installed() const { return installed_.load(); }

 private:
  ModelStack stack_;
  std::atomic<bool> installed_{false};
  std::unique_ptr<InferenceBackend> backend_;
  std::unique_ptr<TextCodec> codec_;
  std::unique_ptr<ChatRenderer> renderer_;
};

}  // namespace m3::server
