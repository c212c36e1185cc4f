#include "backend/comm/tcp_store.h"

#include <arpa/inet.h>
#include <gloo/rendezvous/store.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

namespace m3::comm {

namespace {

// Wire format, both ways: a u32 length (host order: both ends are this program on one
// architecture family) and that many bytes. Requests: "S" key value | "G" key timeout_ms |
// "L" label (the connection's lease). Replies: "K" (set / lease done) | "V" value | "T" (timed
// out).
constexpr char kSet = 'S', kGet = 'G', kLease = 'L', kDone = 'K', kValue = 'V', kTimedOut = 'T';

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_frame(int fd, const std::vector<char>& b) {
  const uint32_t n = static_cast<uint32_t>(b.size());
  return write_all(fd, &n, 4) && write_all(fd, b.data(), b.size());
}

bool read_frame(int fd, std::vector<char>* b) {
  uint32_t n = 0;
  if (!read_all(fd, &n, 4) || n > (64u << 20)) return false;
  b->resize(n);
  return read_all(fd, b->data(), n);
}

void put_string(std::vector<char>& b, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  b.insert(b.end(), reinterpret_cast<const char*>(&n), reinterpret_cast<const char*>(&n) + 4);
  b.insert(b.end(), s.begin(), s.end());
}

bool take_string(const std::vector<char>& b, size_t* at, std::string* s) {
  uint32_t n = 0;
  if (*at + 4 > b.size()) return false;
  std::memcpy(&n, b.data() + *at, 4);
  *at += 4;
  if (*at + n > b.size()) return false;
  s->assign(b.data() + *at, n);
  *at += n;
  return true;
}

Result<sockaddr_in> resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return invalid_argument("[comm.rendezvous] cannot resolve host '" + host + "'");
  }
  sockaddr_in a{};
  std::memcpy(&a, res->ai_addr, sizeof(a));
  freeaddrinfo(res);
  a.sin_port = htons(port);
  return a;
}

}  // namespace

// ---- Server.

struct TcpStoreServer::State {
  int listen_fd = -1;
  uint16_t port = 0;
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, std::vector<char>> values;
  bool stopping = false;
  std::vector<int> client_fds;
  std::vector<std::thread> threads;
  std::thread acceptor;

  void serve(int fd) {
    std::vector<char> req;
    std::string lease;
    while (read_frame(fd, &req) && !req.empty()) {
      size_t at = 1;
      std::string key;
      if (!take_string(req, &at, &key)) break;
      std::vector<char> reply;
      if (req[0] == kLease) {
        lease = key;
        reply.push_back(kDone);
      } else if (req[0] == kSet) {
        {
          std::lock_guard<std::mutex> lock(mu);
          values[key].assign(req.begin() + static_cast<std::ptrdiff_t>(at), req.end());
        }
        changed.notify_all();
        reply.push_back(kDone);
      } else if (req[0] == kGet && at + 8 <= req.size()) {
        int64_t ms = 0;
        std::memcpy(&ms, req.data() + at, 8);
        std::unique_lock<std::mutex> lock(mu);
        const bool found = changed.wait_for(lock, std::chrono::milliseconds(ms), [&] {
          return stopping || values.count(key) > 0;
        });
        if (found && values.count(key) > 0) {
          reply.push_back(kValue);
          reply.insert(reply.end(), values[key].begin(), values[key].end());
        } else {
          reply.push_back(kTimedOut);
        }
      } else {
        break;
      }
      if (!write_frame(fd, reply)) break;
    }
    // The connection is gone: its holder exited or died (TcpStore::hold_lease).
    if (!lease.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!stopping) values["left/" + lease];
      }
      changed.notify_all();
    }
  }
};

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host,
                                                              uint16_t port) {
  M3_ASSIGN_OR_RETURN(sockaddr_in addr, resolve(host, port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kUnavailable, "[comm.rendezvous] socket() failed");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status(StatusCode::kUnavailable, "[comm.rendezvous] cannot listen on " + host + ":" +
                                                std::to_string(port) + ": " + why);
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  auto st = std::make_shared<State>();
  st->listen_fd = fd;
  st->port = ntohs(addr.sin_port);
  st->acceptor = std::thread([st] {
    while (true) {
      const int c = ::accept4(st->listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->stopping) {
        if (c >= 0) ::close(c);
        return;
      }
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      const int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      st->client_fds.push_back(c);
      st->threads.emplace_back([st, c] { st->serve(c); });
    }
  });
  server->state_ = std::move(st);
  return server;
}

uint16_t TcpStoreServer::port() const { return state_->port; }

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
    ::shutdown(state_->listen_fd, SHUT_RDWR);
    for (int c : state_->client_fds) ::shutdown(c, SHUT_RDWR);
  }
  state_->changed.notify_all();
  state_->acceptor.join();
  for (std::thread& t : state_->threads) t.join();
  for (int c : state_->client_fds) ::close(c);
  ::close(state_->listen_fd);
}

// ---- Client.

Result<std::shared_ptr<TcpStore>> TcpStore::connect(const std::string& host, uint16_t port,
                                                    std::chrono::milliseconds timeout) {
  M3_ASSIGN_OR_RETURN(sockaddr_in addr, resolve(host, port));
  const std::string where = host + ":" + std::to_string(port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no attempt";
  while (true) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status(StatusCode::kUnavailable, "[comm.rendezvous] socket() failed");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return std::shared_ptr<TcpStore>(new TcpStore(fd, where));
    }
    last = std::strerror(errno);
    ::close(fd);
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status(StatusCode::kUnavailable,
                "[comm.rendezvous] could not reach the rendezvous at " + where + " within " +
                    std::to_string(timeout.count()) + " ms (" + last +
                    "); is the process of node rank 0 running with the same --dist-init-addr?");
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

Status TcpStore::request(const std::vector<char>& out, std::vector<char>* reply) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!write_frame(fd_, out) || !read_frame(fd_, reply) || reply->empty()) {
    return Status(StatusCode::kUnavailable,
                  "[comm.rendezvous] the rendezvous at " + where_ + " closed the connection");
  }
  return Status::ok();
}

Status TcpStore::set(const std::string& key, const std::vector<char>& value) {
  std::vector<char> out{kSet};
  put_string(out, key);
  out.insert(out.end(), value.begin(), value.end());
  std::vector<char> reply;
  M3_RETURN_IF_ERROR(request(out, &reply));
  if (reply[0] != kDone) return internal_error("[comm.rendezvous] unexpected reply to a set");
  return Status::ok();
}

Status TcpStore::hold_lease(const std::string& label) {
  std::vector<char> out{kLease};
  put_string(out, label);
  std::vector<char> reply;
  M3_RETURN_IF_ERROR(request(out, &reply));
  if (reply[0] != kDone) return internal_error("[comm.rendezvous] unexpected reply to a lease");
  return Status::ok();
}

Result<std::vector<char>> TcpStore::get(const std::string& key,
                                        std::chrono::milliseconds timeout) {
  std::vector<char> out{kGet};
  put_string(out, key);
  const int64_t ms = timeout.count();
  out.insert(out.end(), reinterpret_cast<const char*>(&ms), reinterpret_cast<const char*>(&ms) + 8);
  std::vector<char> reply;
  M3_RETURN_IF_ERROR(request(out, &reply));
  if (reply[0] == kTimedOut) {
    return Status(StatusCode::kUnavailable,
                  "[comm.rendezvous] '" + key + "' was not published at " + where_ + " within " +
                      std::to_string(ms) + " ms (a rank did not join)");
  }
  return std::vector<char>(reply.begin() + 1, reply.end());
}

namespace {

// Gloo's rendezvous interface over a TcpStore; its failures are exceptions, as Gloo expects.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<TcpStore> store, std::chrono::milliseconds timeout,
                   std::string prefix)
      : store_(std::move(store)), timeout_(timeout), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = store_->set(prefix_ + key, data);
    if (!s.is_ok()) throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->get(prefix_ + key, timeout_);
    if (!v.is_ok()) throw std::runtime_error(v.status().message());
    return std::move(v).value();
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& k : keys) {
      auto v = store_->get(prefix_ + k, timeout);
      if (!v.is_ok()) throw std::runtime_error(v.status().message());
    }
  }

 private:
  std::shared_ptr<TcpStore> store_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<gloo::rendezvous::Store> TcpStore::gloo_store(std::chrono::milliseconds timeout,
                                                              std::string key_prefix) {
  return std::make_shared<GlooStoreAdapter>(shared_from_this(), timeout, std::move(key_prefix));
}

}  // namespace m3::comm
