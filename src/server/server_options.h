// Everything `m3serve serve` configures in the HTTP server (the engine's own flags are separate).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "server/media/media_policy.h"

namespace m3::server {

struct ServerOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 30000;
  std::string api_key;                          // empty: no authentication
  std::vector<std::string> served_model_names;  // the first is reported by responses
  std::string model_path;
  std::string version;  // GET /version (the binary's; empty in tests and the fake server)
  std::string reasoning_parser = "minimax-m3";  // or "none"
  std::string tool_call_parser = "minimax-m3";  // or "none"
  int32_t context_length = 0;                   // 0: the backend's
  size_t max_body_bytes = 64u << 20;
  int64_t max_connections = 0;  // 0: derived from the open-file limit
  std::chrono::milliseconds keep_alive_timeout{5000};  // idle connection, or a slow header
  int io_threads = 4;
  int worker_threads = 2;  // request preprocessing (parse, render, tokenize), like SGLang's
                           // --tokenizer-worker-num
  MediaOptions media;
  std::chrono::milliseconds drain_timeout{30000};  // SIGTERM: how long in-flight requests get
  std::chrono::milliseconds health_generate_timeout{20000};
};

}  // namespace m3::server
