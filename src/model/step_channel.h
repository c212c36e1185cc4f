// How the steps of a model split over several processes (--nnodes) reach the processes without
// the engine: node 0's rank 0 sends each ModelStep (step_wire.h's bytes) over a host communicator
// and every other process receives it and runs it on its ranks, in lock step. One protocol for
// both kinds of ranks: CPU ranks send over their world Gloo group (every rank receives), GPU
// ranks, whose world group is NCCL on device memory, over a Gloo group of one rank per node (each
// node's first rank receives and hands the step to its other GPUs in the process).
//
// On the wire: the step's size as one int64 broadcast from rank 0 of the communicator, then its
// bytes; a size of -1 says node 0 shut down cleanly.
#pragma once

#include <chrono>
#include <optional>
#include <vector>

#include "backend/comm/communicator.h"
#include "core/status.h"
#include "model/model.h"
#include "model/step_wire.h"

namespace m3 {

// Rank 0 of `c` sends `step`, or with nullptr the stop. A receiver that is gone fails it
// (unavailable: the group is broken).
Status send_step(comm::Communicator& c, const ModelStep* step);

// A rank other than 0 waits up to `idle_wait` for the next step's size (the server may be idle
// for long; a sender that dies still fails the wait at once, its connection closes), then
// receives and decodes it. nullopt: node 0 shut down. A collective's error (unavailable) or bytes
// that do not decode (invalid_argument: another build on node 0) mean the group is unusable.
Result<std::optional<WireStep>> receive_step(comm::Communicator& c,
                                             std::chrono::milliseconds idle_wait);

// A runner on a process without rank 0: follow() runs the steps node 0 sends until node 0 shuts
// down (ok) or the group breaks (the error, naming the rank that saw it).
class StepFollower {
 public:
  virtual ~StepFollower() = default;
  virtual Status follow() = 0;
};

}  // namespace m3
