// The OpenAI-compatible HTTP server: wires the HTTP layer, the handlers, the worker pool and the
// metrics to a backend, tokenizer and chat renderer. SIGTERM/SIGINT drain: new requests get 503,
// in-flight ones finish (up to --drain-timeout), then the process exits.
#pragma once

#include <memory>

#include "server/backend.h"
#include "server/model_frontend.h"
#include "server/server_options.h"

namespace m3::server {

class Server {
 public:
  Server(ServerOptions options, InferenceBackend* backend, const TextCodec* codec,
         const ChatRenderer* renderer);
  ~Server();

  // Binds the port and starts serving (errors name the address).
  Status start();
  uint16_t port() const;

  // Blocks until SIGTERM or SIGINT, then drains and stops. Returns 0 if every in-flight request
  // finished within the drain timeout, 1 otherwise.
  int wait_for_signal_and_drain();
  // Draining without a signal (tests): returns true if everything finished in time.
  bool drain();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Raises the soft open-file limit to the hard limit (each connection is a descriptor).
void raise_file_limit();

}  // namespace m3::server
