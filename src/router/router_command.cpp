#include "router/router_command.h"

#include <sys/resource.h>

#include <cstdio>

#include "router/router.h"

namespace m3::router {

int run_router_command(const std::vector<std::string>& args) {
  Result<RouterFlags> flags = parse_router_flags(args);
  if (!flags) {
    std::fprintf(stderr, "m3serve router: %s\n", flags.status().message().c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(kRouterUsage, stdout);
    return 0;
  }
  // Two descriptors per request in flight (the client's and the worker's): lift the soft limit
  // (often 1024) to the hard one, as the server does.
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  Router router(*flags);
  if (Status s = router.start(); !s) {
    std::fprintf(stderr, "m3serve router: %s\n", s.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "m3serve router: %s over %zu worker(s) on http://%s:%u\n",
               policy_name(flags->policy), flags->worker_urls.size(), flags->host.c_str(),
               router.port());
  std::fflush(stderr);
  router.wait_for_signal();
  return 0;
}

}  // namespace m3::router
