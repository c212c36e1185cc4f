// The rendezvous of ranks in several processes or nodes (--dist-init-addr HOST:PORT): the
// process of node rank 0 serves a small key-value store over TCP (TcpStoreServer), and every
// process connects to it (TcpStore). Ranks publish and read what they need to find each other:
// Gloo's transport addresses (gloo_store()), or the NCCL unique id. A read waits until the key is
// written or its timeout passes; an unreachable store fails with an error naming the address.
// This header includes no Gloo header.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace gloo::rendezvous {
class Store;
}

namespace m3::comm {

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any free port, see port()).
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& host, uint16_t port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  uint16_t port() const;

  struct State;

 private:
  TcpStoreServer() = default;
  std::shared_ptr<State> state_;
};

class TcpStore : public std::enable_shared_from_this<TcpStore> {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later than this
  // process).
  static Result<std::shared_ptr<TcpStore>> connect(const std::string& host, uint16_t port,
                                                   std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  Status set(const std::string& key, const std::vector<char>& value);
  // Names this connection `label`: when it closes (this process exited or died), the server
  // publishes the key "left/<label>", so the others can tell which process is gone.
  Status hold_lease(const std::string& label);
  // Waits until `key` is set, or fails with unavailable after `timeout`.
  Result<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout);
  // This store as Gloo's rendezvous store (create_gloo_communicator's argument); its reads wait
  // up to `timeout`. Every key is prefixed with `key_prefix`: several Gloo groups rendezvous
  // through one store (the world group and each attention data-parallel group), and Gloo names its
  // keys by rank alone.
  std::shared_ptr<gloo::rendezvous::Store> gloo_store(std::chrono::milliseconds timeout,
                                                      std::string key_prefix = "");

 private:
  explicit TcpStore(int fd, std::string where) : fd_(fd), where_(std::move(where)) {}
  Status request(const std::vector<char>& out, std::vector<char>* reply);
  int fd_ = -1;
  std::string where_;
  std::mutex mu_;  // one request at a time on the connection
};

}  // namespace m3::comm
