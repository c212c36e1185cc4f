// Runs the benchmark: sends the workload's requests at their Poisson arrival times, at most
// max_concurrency in flight (a request that arrives while all slots are taken waits for one, in
// arrival order, as sglang's semaphore does), and records each request's outcome. One thread and
// one io_context drive every connection, so timestamps cost no locking and the client stays light
// beside a server on the same cores.
#pragma once

#include <string>
#include <vector>

#include "bench/http_client.h"
#include "bench/openai_stream.h"
#include "bench/stats.h"
#include "bench/workload.h"
#include "core/status.h"

namespace m3::bench {

struct RunOptions {
  Endpoint endpoint;
  Backend backend = Backend::kOpenAiCompletions;
  GenerationParams params;
  std::string api_key;
  int max_concurrency = 0;  // 0: no limit
  double request_rate = 0;  // requests/s; infinity sends everything at once
  uint64_t seed = 1;
  double timeout_s = 0;   // per request, connect to last byte; 0: no limit
  bool progress = false;  // a line on stderr as requests finish
  // Mixed workloads: the leading requests marked `stream` are sent at once at the start (each
  // still takes a concurrency slot); the others arrive at the request rate from this offset.
  double arrival_delay_s = 0;
};

// Multi-turn workloads (requests with conversation >= 0, consecutive per conversation, as
// make_workload orders them): conversations arrive at the Poisson times, and each sends its
// turns one after the other, each turn's request carrying the earlier turns' user messages and
// answers. max_concurrency bounds the requests in flight as before.

struct RunOutput {
  std::vector<RequestResult> results;  // in workload order
  double duration_s = 0;               // first send to last finish
};

// Fails only when the host cannot be resolved; a refused connection or an HTTP error is a failed
// request in the output, not an error of the run.
Result<RunOutput> run_benchmark(const RunOptions& options,
                                const std::vector<BenchRequest>& requests);

}  // namespace m3::bench
