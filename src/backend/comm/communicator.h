// Collectives between the ranks a model is split over (tensor, expert and attention-data
// parallelism): one interface, two implementations. GlooCommunicator (gloo_communicator.h) runs
// CPU ranks, in one process or across processes and nodes over TCP; the NCCL communicator
// (backend/cuda/comm) runs GPU ranks. The sharded model code is written once against this
// interface, so every sharded path runs and is tested on CPU ranks exactly as on GPUs.
//
// Buffers are host memory for CPU ranks and device memory for GPU ranks. Every call is a
// collective: each rank of the group makes the same calls in the same order with the same
// counts (all_to_all_v: matching send and receive counts). A call that cannot complete within
// the communicator's timeout (a rank died or stopped calling) returns unavailable naming the
// collective and the timeout; the group is then unusable and the process should stop serving.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace m3::comm {

enum class DataType : int { kF32 = 0, kBF16 = 1, kI32 = 2, kI64 = 3, kU8 = 4 };
enum class ReduceOp : int { kSum = 0, kMax = 1 };

size_t element_bytes(DataType t);
const char* data_type_name(DataType t);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo" or "nccl", for logs and the startup report.
  virtual std::string name() const = 0;

  // buf[count] on every rank becomes the element-wise reduction over the ranks. Sums of float
  // types are taken in an order that depends on the implementation and the group size (callers'
  // tolerances account for the reordering); bf16 is summed in float32 and rounded once per step.
  virtual Status all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) = 0;
  // recv[size * count] = the send[count] of every rank, in rank order.
  virtual Status all_gather(const void* send, void* recv, int64_t count, DataType type) = 0;
  // recv[count] = the reduction over the ranks of their send[rank * count .. (rank + 1) * count).
  virtual Status reduce_scatter(const void* send, void* recv, int64_t count, DataType type,
                                ReduceOp op) = 0;
  // Variable all-to-all: send holds send_counts[r] elements for each rank r, contiguous in rank
  // order; recv receives recv_counts[r] elements from each rank r, in rank order. Counts have
  // size() entries; send_counts[r] on this rank equals recv_counts[this rank] on rank r.
  virtual Status all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                              std::span<const int64_t> recv_counts, DataType type) = 0;
  // buf[count] on every rank becomes root's.
  virtual Status broadcast(void* buf, int64_t count, DataType type, int root) = 0;
  // broadcast() that may wait up to `timeout` instead of the group's collective timeout: for
  // ranks that wait for the next step while the server is idle (a rank that dies still fails it
  // at once: its connections close). Implementations without per-call timeouts use broadcast().
  virtual Status broadcast_wait(void* buf, int64_t count, DataType type, int root,
                                std::chrono::milliseconds timeout) {
    (void)timeout;
    return broadcast(buf, count, type, root);
  }
  virtual Status barrier() = 0;
  // Returns once the collectives queued so far have completed (CPU ranks: at once, every call is
  // synchronous). GPU ranks queue on a stream; this is where a collective that does not finish
  // within the timeout is detected and the group aborted.
  virtual Status synchronize() = 0;
};

}  // namespace m3::comm
