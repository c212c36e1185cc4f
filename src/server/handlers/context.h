// State shared by all handlers of one server.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include "server/backend.h"
#include "server/metrics.h"
#include "server/model_frontend.h"
#include "server/server_options.h"

namespace boost::asio {
class thread_pool;
}

namespace m3::server {

struct ServerContext {
  ServerOptions options;
  InferenceBackend* backend = nullptr;
  const TextCodec* codec = nullptr;
  const ChatRenderer* renderer = nullptr;
  std::unique_ptr<Metrics> metrics;
  boost::asio::thread_pool* workers = nullptr;  // preprocessing pool
  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};  // generation jobs alive (GenerationJob)
  // Backend ids of live jobs, so shutdown can cancel them.
  std::mutex live_mu;
  std::set<uint64_t> live_ids;
  std::function<int64_t()> open_connections;     // from the HTTP layer, for /metrics
  std::function<int64_t()> refused_connections;  // likewise

  const std::string& model_name() const { return options.served_model_names.front(); }
  int32_t context_length() const {
    int32_t b = backend->context_length();
    int32_t o = options.context_length;
    return o > 0 && (b <= 0 || o < b) ? o : b;
  }
};

}  // namespace m3::server
