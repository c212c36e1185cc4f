// Several processes ("nodes") serving one model on CPU ranks, with SGLang's flags: --nnodes N,
// --node-rank K, --dist-init-addr HOST:PORT, --dist-timeout SECONDS. Node 0 serves HTTP and runs
// the engine; every node holds --tp / N of the ranks. Node 0 serves the rendezvous (a TCP
// key-value store, backend/comm/tcp_store.h) at HOST:PORT; every node connects to it, holds a
// lease on its connection (so the others learn when it is gone), and joins its ranks to one Gloo
// group through it (and, with --enable-dp-attention --dp, each rank its attention group). Node 0
// then publishes the KV pool's page count, which every node allocates.
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

}  // namespace m3::app
