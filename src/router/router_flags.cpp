#include "router/router_flags.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <cmath>

#include "router/worker_registry.h"

namespace m3::router {

const char* const kRouterUsage = R"(usage: m3serve router --worker-urls URL... [options]

Routes OpenAI API requests over several m3serve (or other OpenAI-compatible) workers, keeping
requests that share a prefix on the same worker so its prefix cache is reused (docs/router.md).

workers:
  --worker-urls URL...          http://host:port of each worker (may be empty: add them later
                                with POST /add_worker?url=...)
  --health-check-interval-secs S  seconds between /health probes of each worker (default 10)
  --health-check-timeout-secs S   a probe without an answer after S seconds fails (default 5)
policy:
  --policy P                    cache_aware (default), round_robin, random or power_of_two
  --cache-threshold R           cache_aware: follow the longest prefix match when it covers at
                                least this fraction of the request text (default 0.5)
  --balance-abs-threshold N     cache_aware: the load is imbalanced when max - min in-flight
  --balance-rel-threshold R     requests > N (default 32) and max > R * min (default 1.0001);
                                then the least loaded worker gets the request
  --eviction-interval S         seconds between evictions of the prefix trees (default 60)
  --max-tree-size N             bytes of request text kept per worker's tree (default 16777216)
  --random-seed N               seed of random and power_of_two (default: from the clock)
requests:
  --retry-max-retries N         attempts per request, on different workers; a request is retried
                                only if its worker failed before the first response byte
                                (default 3)
  --request-timeout-secs S      a worker without a complete response after S seconds fails the
                                request (default 0: no limit)
server:
  --host H                      address to listen on (default 127.0.0.1)
  --port P                      port (default 30000; 0: any free port)
  --api-key K                   required as "Authorization: Bearer K" on every route but /health,
                                and on the admin routes (/add_worker, /remove_worker,
                                /list_workers); forwarded to the workers as sent
)";

const char* policy_name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kCacheAware:
      return "cache_aware";
    case PolicyKind::kRoundRobin:
      return "round_robin";
    case PolicyKind::kRandom:
      return "random";
    case PolicyKind::kPowerOfTwo:
      return "power_of_two";
  }
  return "?";
}

namespace {

Result<int64_t> parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  int64_t x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi) {
    return invalid_argument(flag + " '" + v + "': expected an integer in [" + std::to_string(lo) +
                            ", " + std::to_string(hi) + "]");
  }
  return x;
}

Result<double> parse_double(const std::string& flag, const std::string& v, double lo, double hi) {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x) && x >= lo && x <= hi) return x;
  } catch (const std::exception&) {
  }
  return invalid_argument(flag + " '" + v + "': expected a number in [" + std::to_string(lo) +
                          ", " + std::to_string(hi) + "]");
}

}  // namespace

Result<RouterFlags> parse_router_flags(const std::vector<std::string>& args) {
  RouterFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string value;
    bool has_inline = false;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_inline = true;
    }
    auto next = [&]() -> Result<std::string> {
      if (has_inline) return value;
      if (i + 1 >= args.size()) return invalid_argument(flag + " needs a value");
      return args[++i];
    };
    if (flag == "--help" || flag == "-h") {
      f.help = true;
      continue;
    }
    if (flag == "--worker-urls") {
      // Takes every following argument up to the next flag (nargs='+' as in SGLang's router).
      if (has_inline) {
        f.worker_urls.push_back(value);
      }
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        f.worker_urls.push_back(args[++i]);
      }
      continue;
    }
    static constexpr const char* kValueFlags[] = {
        "--policy", "--cache-threshold", "--balance-abs-threshold", "--balance-rel-threshold",
        "--eviction-interval", "--eviction-interval-secs", "--max-tree-size",
        "--health-check-interval-secs", "--health-check-timeout-secs", "--retry-max-retries",
        "--request-timeout-secs", "--random-seed", "--host", "--port", "--api-key"};
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), flag) == std::end(kValueFlags)) {
      return invalid_argument("unknown option '" + flag + "' (see 'm3serve router --help')");
    }
    M3_ASSIGN_OR_RETURN(std::string v, next());
    if (flag == "--policy") {
      if (v == "cache_aware") {
        f.policy = PolicyKind::kCacheAware;
      } else if (v == "round_robin") {
        f.policy = PolicyKind::kRoundRobin;
      } else if (v == "random") {
        f.policy = PolicyKind::kRandom;
      } else if (v == "power_of_two") {
        f.policy = PolicyKind::kPowerOfTwo;
      } else {
        return invalid_argument("--policy '" + v +
                                "': expected cache_aware, round_robin, random or power_of_two");
      }
    } else if (flag == "--cache-threshold") {
      M3_ASSIGN_OR_RETURN(f.cache_threshold, parse_double(flag, v, 0.0, 1.0));
    } else if (flag == "--balance-abs-threshold") {
      M3_ASSIGN_OR_RETURN(f.balance_abs_threshold, parse_int(flag, v, 0, 1'000'000'000));
    } else if (flag == "--balance-rel-threshold") {
      M3_ASSIGN_OR_RETURN(f.balance_rel_threshold, parse_double(flag, v, 1.0, 1e9));
    } else if (flag == "--eviction-interval" || flag == "--eviction-interval-secs") {
      M3_ASSIGN_OR_RETURN(f.eviction_interval_s, parse_double(flag, v, 0.001, 1e7));
    } else if (flag == "--max-tree-size") {
      M3_ASSIGN_OR_RETURN(f.max_tree_size, parse_int(flag, v, 1, int64_t{1} << 40));
    } else if (flag == "--health-check-interval-secs") {
      M3_ASSIGN_OR_RETURN(f.health_check_interval_s, parse_double(flag, v, 0.01, 1e7));
    } else if (flag == "--health-check-timeout-secs") {
      M3_ASSIGN_OR_RETURN(f.health_check_timeout_s, parse_double(flag, v, 0.01, 1e7));
    } else if (flag == "--retry-max-retries") {
      M3_ASSIGN_OR_RETURN(int64_t n, parse_int(flag, v, 1, 100));
      f.max_attempts = static_cast<int>(n);
    } else if (flag == "--request-timeout-secs") {
      M3_ASSIGN_OR_RETURN(f.request_timeout_s, parse_double(flag, v, 0.0, 1e7));
    } else if (flag == "--random-seed") {
      M3_ASSIGN_OR_RETURN(int64_t n, parse_int(flag, v, 0, INT64_MAX));
      f.seed = static_cast<uint64_t>(n);
    } else if (flag == "--host") {
      if (v.empty()) return invalid_argument("--host needs a non-empty value");
      f.host = v;
    } else if (flag == "--port") {
      M3_ASSIGN_OR_RETURN(int64_t p, parse_int(flag, v, 0, 65535));
      f.port = static_cast<int>(p);
    } else if (flag == "--api-key") {
      f.api_key = v;
    } else {
      return invalid_argument("unknown option '" + flag + "' (see 'm3serve router --help')");
    }
  }
  for (const std::string& url : f.worker_urls) {
    M3_RETURN_IF_ERROR(parse_worker_url(url).status());
  }
  return f;
}

}  // namespace m3::router
