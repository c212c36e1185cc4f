#include "router/policy.h"

#include <tuple>

namespace m3::router {

size_t least_loaded(const std::vector<Candidate>& c) {
  size_t best = 0;
  for (size_t i = 1; i < c.size(); ++i) {
    if (std::tie(c[i].load, c[i].processed, c[i].worker_id) <
        std::tie(c[best].load, c[best].processed, c[best].worker_id)) {
      best = i;
    }
  }
  return best;
}

Selection RoundRobinPolicy::select(std::string_view, const std::vector<Candidate>& c) {
  std::lock_guard<std::mutex> lock(mu_);
  Selection s;
  s.worker_id = c[next_++ % c.size()].worker_id;
  return s;
}

Selection RandomPolicy::select(std::string_view, const std::vector<Candidate>& c) {
  std::lock_guard<std::mutex> lock(mu_);
  Selection s;
  s.worker_id = c[rng_() % c.size()].worker_id;
  return s;
}

Selection PowerOfTwoPolicy::select(std::string_view, const std::vector<Candidate>& c) {
  Selection s;
  if (c.size() == 1) {
    s.worker_id = c[0].worker_id;
    return s;
  }
  size_t a = 0, b = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    a = rng_() % c.size();
    b = rng_() % (c.size() - 1);
  }
  if (b >= a) ++b;  // two distinct candidates
  s.worker_id = c[a].load <= c[b].load ? c[a].worker_id : c[b].worker_id;
  return s;
}

}  // namespace m3::router
