// Communicator on GPU ranks over NCCL, within a node (NVLink, PCIe) and across nodes. Collectives
// are queued on the rank's stream (asynchronous to the host; they can be captured into CUDA
// graphs); synchronize() waits for them with the timeout as a watchdog: a collective that does
// not finish in time (a rank died or stopped calling) aborts the NCCL communicator, which frees
// the GPU, and returns unavailable naming the rank. This header includes no CUDA or NCCL header.
#pragma once

#include <array>
#include <chrono>
#include <memory>

#include "backend/comm/communicator.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::comm {

// The identifier every rank of one NCCL group is created with: made by one rank and handed to
// the others (through the rendezvous store across processes).
struct NcclUniqueId {
  std::array<char, 128> bytes{};
};
Result<NcclUniqueId> make_nccl_unique_id();

struct NcclOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Rank `rank` of `size` on CUDA device `device`, queuing on `stream` (the compute stream, so
// that collectives order with the kernels around them). Blocks until every rank has joined.
Result<std::unique_ptr<Communicator>> create_nccl_communicator(int rank, int size, int device,
                                                               const NcclUniqueId& id,
                                                               CUstream_st* stream,
                                                               const NcclOptions& options = {});

}  // namespace m3::comm
