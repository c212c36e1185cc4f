// A loopback HTTP server for tests that fetch remote images (remote_fetch_test,
// remote_image_server_test): one thread, one connection at a time, routes by path.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace m3::server::testing_http {

// A tiny HTTP/1.0-style server: one thread, one connection at a time, routes by path. Each
// route returns the raw response bytes to send (or sleeps first). It records request heads.
class LoopbackServer {
 public:
  using Route = std::function<std::string()>;
  LoopbackServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listen(fd_, 16);
    thread_ = std::thread([this] { serve(); });
  }
  ~LoopbackServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  void route(const std::string& path, Route r) {
    std::lock_guard<std::mutex> l(mu_);
    routes_[path] = std::move(r);
  }
  int port() const { return port_; }
  std::string base(const std::string& host = "127.0.0.1") const {
    return "http://" + host + ":" + std::to_string(port_);
  }
  std::vector<std::string> heads() {
    std::lock_guard<std::mutex> l(mu_);
    return heads_;
  }

  static std::string response(int status, const std::string& type, const std::string& body,
                              const std::string& extra = "") {
    return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: " + type +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra +
           "Connection: close\r\n\r\n" + body;
  }
  static std::string redirect(const std::string& to, const std::string& extra = "") {
    return "HTTP/1.1 302 Found\r\nLocation: " + to + "\r\nContent-Length: 0\r\n" + extra +
           "Connection: close\r\n\r\n";
  }

 private:
  void serve() {
    while (!stop_) {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        head.append(buf, static_cast<size_t>(n));
      }
      std::string path;
      if (size_t sp = head.find(' '); sp != std::string::npos)
        path = head.substr(sp + 1, head.find(' ', sp + 1) - sp - 1);
      Route r;
      {
        std::lock_guard<std::mutex> l(mu_);
        heads_.push_back(head);
        auto it = routes_.find(path);
        if (it != routes_.end()) r = it->second;
      }
      const std::string out = r ? r() : response(404, "text/plain", "no");
      size_t sent = 0;
      while (sent < out.size()) {
        ssize_t n = send(c, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
      close(c);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<std::string, Route> routes_;
  std::vector<std::string> heads_;
  std::thread thread_;
};

}  // namespace m3::server::testing_http
