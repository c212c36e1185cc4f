// Communicator on CPU ranks over Gloo (Debian's libgloo-dev, the CPU collective library PyTorch
// uses), with its TCP transport. Ranks rendezvous through a key-value store: in one process a
// shared in-memory store (create_local_gloo_group, the tests' and --device cpu --tp N's form),
// across processes the store of the multi-node rendezvous. This header includes no Gloo header.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend/comm/communicator.h"
#include "core/status.h"

namespace gloo::rendezvous {
class Store;
}

namespace m3::comm {

struct GlooOptions {
  // Every collective, and the rendezvous, fails after this long without completing.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // The address the rank's TCP transport listens on ("127.0.0.1" within one machine).
  std::string hostname = "127.0.0.1";
};

// Rank `rank` of `size`, connected to every other rank through `store` (blocks until all ranks
// have joined, or fails after options.timeout naming the rank and the group).
Result<std::unique_ptr<Communicator>> create_gloo_communicator(
    int rank, int size, const std::shared_ptr<gloo::rendezvous::Store>& store,
    const GlooOptions& options = {});

// `size` ranks in this process (an in-memory store; each rank connects on its own thread).
// Element r is rank r. Each communicator is then used by one thread at a time.
Result<std::vector<std::unique_ptr<Communicator>>> create_local_gloo_group(
    int size, const GlooOptions& options = {});

}  // namespace m3::comm
