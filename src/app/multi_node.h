// Several processes ("nodes") serving one model, with SGLang's flags: --nnodes N, --node-rank K,
// --dist-init-addr HOST:PORT, --dist-timeout SECONDS. Node 0 serves HTTP and runs the engine;
// every node holds --tp / N of the ranks. Node 0 serves the rendezvous (a TCP key-value store,
// backend/comm/tcp_store.h) at HOST:PORT; every node connects to it and holds a lease on its
// connection (so the others learn when it is gone).
//  - CPU ranks (join_nodes): every rank joins one Gloo group through it (and, with
//    --enable-dp-attention --dp, its attention group); node 0 then publishes the KV pool's page
//    count, which every node allocates.
//  - GPU ranks (join_gpu_nodes): each node's process drives its GPUs; their world group is one
//    NCCL communicator whose unique id node 0 makes and publishes in the store. The steps travel
//    over a Gloo group of one rank per node (model/step_channel.h), and node 0 publishes how the
//    KV pool is sized so that every GPU runs the same profile step (the pages themselves are
//    agreed over NCCL: the fewest any GPU can hold).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/minimax_m3/tensor_parallel_runner.h"

namespace m3::app {

struct NodeLayout {
  int32_t nnodes = 1;
  int32_t node_rank = 0;
  std::string dist_init_addr;  // HOST:PORT
  std::chrono::seconds dist_timeout{300};
};

// Checks the flags against the rank count: nnodes divides tp, node_rank < nnodes, an address
// when nnodes > 1. Errors name the flags.
Status check_node_layout(const NodeLayout& nodes, int tp);

// HOST and PORT of --dist-init-addr, or invalid_argument naming the flag.
Result<std::pair<std::string, uint16_t>> parse_dist_init_addr(const std::string& addr);

// This process's ranks of the group, joined (blocks until every node has joined, or fails after
// dist_timeout naming the address). The rendezvous lives as long as the runner that keeps
// LocalRanks::keepalive. With attention data parallelism (dp > 1, dp divides tp) and groups of
// more than one rank, each rank also joins its attention group (ranks [g·tp/dp, (g+1)·tp/dp),
// inside one node or spanning several) through the same store under the key prefix
// "m3/attn<g>/" (LocalRanks::attn_comms).
struct JoinedRanks {
  LocalRanks ranks;
  // Node 0: publishes `pages`; the others: read what node 0 published (within dist_timeout).
  std::function<Result<int32_t>(int32_t pages)> share_kv_pages;
  // After the group broke: which nodes have left the rendezvous ("" if none is known to).
  std::function<std::string()> nodes_gone;
};
Result<JoinedRanks> join_nodes(const NodeLayout& nodes, int tp, int dp = 1);

// The ranks of node `node_rank` when `tp` ranks are spread evenly over `nnodes` nodes: global
// ranks [first, first + count). (Node k holds ranks k·tp/N .. (k+1)·tp/N - 1, SGLang's order.)
struct NodeRanks {
  int first = 0;
  int count = 1;
};
NodeRanks node_ranks(int tp, int nnodes, int node_rank);

// How node 0's GPUs size their KV pool, which every node's GPUs must do alike (the profile step
// runs the model's collectives on every GPU): kv_cache_bytes > 0, that many bytes per GPU; else a
// profile step of profile_tokens tokens, then the fewest pages any GPU's plan allows.
struct GpuPoolShare {
  int64_t kv_cache_bytes = 0;
  int64_t profile_tokens = 0;
};

// This node's part of a group of GPU ranks over several nodes (see above). Lives as long as the
// runner that keeps it (keepalive: the rendezvous).
struct JoinedGpuNodes {
  NodeRanks ranks;  // this node's GPUs: global ranks [ranks.first, ranks.first + ranks.count)
  int nnodes = 1;
  int node_rank = 0;
  // Gloo, one rank per node (rank = node rank): node 0 sends the steps over it.
  std::shared_ptr<comm::Communicator> steps;
  // Node 0: publishes `id` (the NCCL unique id's bytes) and returns it; the others read node 0's
  // (unavailable after --dist-timeout, naming --dist-init-addr).
  std::function<Result<std::vector<char>>(const std::vector<char>& id)> share_unique_id;
  // Node 0: publishes its pool sizing; the others read it (within --dist-timeout).
  std::function<Result<GpuPoolShare>(const GpuPoolShare& mine)> share_pool;
  // After the group broke: which nodes have left the rendezvous ("" if none is known to).
  std::function<std::string()> nodes_gone;
  // How long a follower's first GPU waits for the next step (an idle server).
  std::chrono::milliseconds idle_wait{std::chrono::hours(24 * 365)};
  std::shared_ptr<void> keepalive;  // the rendezvous
};
// Connects this node to the rendezvous and joins the nodes' step group (blocks until every node
// has, or fails after dist_timeout naming the address). dp: the --dp every node must share (node
// 0's is published as for join_nodes).
Result<std::shared_ptr<JoinedGpuNodes>> join_gpu_nodes(const NodeLayout& nodes, int tp,
                                                       int dp = 1);

// How a node other than node 0 ends once its ranks stop following (StepFollower::follow's
// status): 0 with a line when node 0 shut down cleanly; else one line naming the cause (with the
// nodes that left the rendezvous, when it knows) and std::_Exit(1) (ranks of a broken group may
// still wait on peers that never answer: they are not unwound).
int end_following(const NodeLayout& nodes, const Status& followed,
                  const std::function<std::string()>& nodes_gone);

}  // namespace m3::app
