#include "router/worker_registry.h"

namespace m3::router {

namespace {
std::string normalized(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}
}  // namespace

Result<bench::Endpoint> parse_worker_url(const std::string& url) {
  Result<bench::Endpoint> ep = bench::parse_base_url(url);
  if (!ep) {
    // parse_base_url names the benchmark's flag; name the worker URL instead.
    std::string m = ep.status().message();
    if (m.rfind("--base-url ", 0) == 0) m.erase(0, 11);
    return Status(ep.status().code(), "worker URL " + m);
  }
  return ep;
}

Result<std::shared_ptr<Worker>> WorkerRegistry::add(const std::string& raw_url) {
  const std::string url = normalized(raw_url);
  M3_ASSIGN_OR_RETURN(bench::Endpoint ep, parse_worker_url(url));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : workers_) {
    if (w->url == url) return invalid_argument("worker " + url + " is already in the pool");
  }
  auto w = std::make_shared<Worker>();
  w->id = next_id_++;
  w->url = url;
  w->endpoint = std::move(ep);
  workers_.push_back(w);
  return w;
}

std::shared_ptr<Worker> WorkerRegistry::remove(const std::string& raw_url) {
  const std::string url = normalized(raw_url);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if ((*it)->url == url) {
      auto w = *it;
      workers_.erase(it);
      return w;
    }
  }
  return nullptr;
}

std::vector<std::shared_ptr<Worker>> WorkerRegistry::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_;
}

std::shared_ptr<Worker> WorkerRegistry::find(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& w : workers_) {
    if (w->id == id) return w;
  }
  return nullptr;
}

}  // namespace m3::router
