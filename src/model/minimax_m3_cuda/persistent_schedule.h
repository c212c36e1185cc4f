// The instruction lists of a persistent decode kernel (docs/design/decode-kernels.md) and
// the host check that they cannot deadlock. Host-only (no CUDA): the lists are built and checked
// once per (layer kind, batch bucket) before the first launch, and the kernel then trusts them.
//
// The machine model. Every SM runs one resident CTA with two agents:
//  * a loader that walks the SM's ops in order and streams each op's weight pages into a ring of
//    `ring_pages` shared-memory pages: before the first page of an op it waits for the op's
//    `load_wait` (e.g. the routed experts' weights need the router's expert ids), and each page
//    needs a free slot;
//  * a consumer that walks the same ops in order: an op runs once all of its `waits` hold and all
//    of its pages are in the ring; when it is done its pages are freed and its `signal` counter
//    (if any) goes up by one.
// Counters live in global memory, start at 0 and only grow, so whether the whole schedule can
// finish does not depend on the order in which the agents make progress: advancing every agent
// that can advance until none can decides it exactly. That is what check_schedule does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace m3::minimax_m3::persistent {

// "Counter `counter` has reached `count`". counter -1: no condition.
struct Wait {
  int32_t counter = -1;
  uint32_t count = 0;
};

struct Op {
  int32_t kind = 0;         // what the kernel runs (opaque here; named in error messages)
  std::vector<Wait> waits;  // the consumer's conditions before it runs the op
  Wait load_wait;           // the loader's condition before the op's first page
  int32_t pages = 0;        // weight pages the op reads through the ring (0: none)
  int32_t signal = -1;      // counter incremented when the op is done (-1: none)
};

struct Schedule {
  std::vector<std::vector<Op>> sms;  // the ops of each SM, in order
  int32_t num_counters = 0;
  int32_t ring_pages = 1;               // slots of each SM's ring
  std::vector<std::string> kind_names;  // optional: kind_names[kind] for messages
};

// What the check found out.
struct ScheduleReport {
  int64_t ops = 0, pages = 0;
  std::vector<uint32_t> final_counts;  // every counter's value once every op is done
};

// invalid_argument naming the SM, the op (index and kind) and the condition that can never hold
// when the lists deadlock; also for malformed lists (a counter out of range, an op with more pages
// than the ring, a wait for more signals than the schedule has for that counter, no SMs, a ring
// of fewer than one page).
Result<ScheduleReport> check_schedule(const Schedule& s);

}  // namespace m3::minimax_m3::persistent
