#include "app/multi_node.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "backend/comm/gloo_communicator.h"
#include "backend/comm/tcp_store.h"

namespace m3::app {

namespace {

// The address of this machine's interface that reaches `host` (a UDP "connection" sends
// nothing; the kernel just picks the route), which the other nodes connect to for this node's
// Gloo transport.
std::string local_address_toward(const std::string& host, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "127.0.0.1";
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  std::string out = "127.0.0.1";
  if (inet_pton(AF_INET, host.c_str(), &to.sin_addr) == 1 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof(me);
    char buf[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf)) != nullptr) {
      out = buf;
    }
  }
  ::close(fd);
  return out;
}

// What the rendezvous keeps alive: node 0's server and every node's connection.
struct Rendezvous {
  std::unique_ptr<comm::TcpStoreServer> server;
  std::shared_ptr<comm::TcpStore> store;
  // One connection per local rank for Gloo's rendezvous: a connection serves one request at a
  // time, and a rank's waiting read must not hold up another rank's write.
  std::vector<std::shared_ptr<comm::TcpStore>> rank_stores;
};

// Node 0 serves the rendezvous; every node connects to it, holds its lease and checks its --dp
// against node 0's (a node started with another --dp would join other groups, or none, and run
// other collectives than node 0).
Result<std::shared_ptr<Rendezvous>> open_rendezvous(const NodeLayout& n, int dp) {
  M3_ASSIGN_OR_RETURN(auto host_port, parse_dist_init_addr(n.dist_init_addr));
  const auto& [host, port] = host_port;
  const std::chrono::milliseconds timeout = n.dist_timeout;
  auto rv = std::make_shared<Rendezvous>();
  if (n.node_rank == 0) {
    auto server = comm::TcpStoreServer::start(host, port);
    if (!server.is_ok()) {
      return Status(server.status().code(), "--dist-init-addr " + n.dist_init_addr +
                                                ": node 0 serves the rendezvous there: " +
                                                server.status().message());
    }
    rv->server = std::move(server).value();
  }
  M3_ASSIGN_OR_RETURN(rv->store, comm::TcpStore::connect(host, port, timeout));
  M3_RETURN_IF_ERROR(rv->store->hold_lease("node" + std::to_string(n.node_rank)));
  const std::string dp_key = "m3/dp";
  if (n.node_rank == 0) {
    const std::string v = std::to_string(dp);
    M3_RETURN_IF_ERROR(rv->store->set(dp_key, std::vector<char>(v.begin(), v.end())));
  } else {
    M3_ASSIGN_OR_RETURN(std::vector<char> v, rv->store->get(dp_key, timeout));
    const std::string node0_dp(v.begin(), v.end());
    if (node0_dp != std::to_string(dp)) {
      return invalid_argument("node " + std::to_string(n.node_rank) + ": --dp " +
                              std::to_string(dp) + " (with --enable-dp-attention) but node 0 "
                              "serves --dp " + node0_dp +
                              "; start every node with the same parallel flags");
    }
  }
  return rv;
}

// Node 0 publishes `mine` under `key` and returns it; the others read node 0's, waiting up to
// --dist-timeout. `what` names the value in the error.
Result<std::vector<char>> publish_or_read(const Rendezvous& rv, const NodeLayout& n,
                                          const std::string& key, const std::vector<char>& mine,
                                          const std::string& what) {
  if (n.node_rank == 0) {
    M3_RETURN_IF_ERROR(rv.store->set(key, mine));
    return mine;
  }
  Result<std::vector<char>> v = rv.store->get(key, n.dist_timeout);
  if (!v.is_ok()) {
    return Status(v.status().code(), "node " + std::to_string(n.node_rank) + ": no " + what +
                                         " from node 0 at --dist-init-addr " + n.dist_init_addr +
                                         " within --dist-timeout " +
                                         std::to_string(n.dist_timeout.count()) +
                                         " s: " + v.status().message());
  }
  return v;
}

// After a failure: the nodes whose lease ended, each with its ranks.
std::function<std::string()> nodes_gone_fn(std::shared_ptr<Rendezvous> rv, int nnodes,
                                           int per_node) {
  return [rv, nnodes, per_node]() {
    std::string gone;
    for (int k = 0; k < nnodes; ++k) {
      // A killed process's connection closes at once; give the rendezvous a moment to see it.
      auto v = rv->store->get("left/node" + std::to_string(k), std::chrono::milliseconds(500));
      if (!v.is_ok() && v.status().message().find("closed the connection") != std::string::npos) {
        return "node 0 (ranks 0.." + std::to_string(per_node - 1) +
               ") is gone: the rendezvous it served closed";
      }
      if (!v.is_ok()) continue;
      if (!gone.empty()) gone += ", ";
      gone += "node " + std::to_string(k) + " (ranks " + std::to_string(k * per_node) + ".." +
              std::to_string((k + 1) * per_node - 1) + ")";
    }
    return gone.empty() ? std::string() : gone + " left the rendezvous";
  };
}

}  // namespace

Result<std::pair<std::string, uint16_t>> parse_dist_init_addr(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  const auto bad = [&] {
    return invalid_argument("--dist-init-addr '" + addr +
                            "': expected HOST:PORT (node 0's address, e.g. 10.0.0.1:5000)");
  };
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) return bad();
  const std::string port_text = addr.substr(colon + 1);
  if (port_text.find_first_not_of("0123456789") != std::string::npos || port_text.size() > 5)
    return bad();
  const int port = std::stoi(port_text);
  if (port < 1 || port > 65535) return bad();
  return std::make_pair(addr.substr(0, colon), static_cast<uint16_t>(port));
}

Status check_node_layout(const NodeLayout& n, int tp) {
  if (n.nnodes < 1) return invalid_argument("--nnodes " + std::to_string(n.nnodes) + " < 1");
  if (n.node_rank < 0 || n.node_rank >= n.nnodes) {
    return invalid_argument("--node-rank " + std::to_string(n.node_rank) + " outside [0, " +
                            std::to_string(n.nnodes) + ") for --nnodes " +
                            std::to_string(n.nnodes));
  }
  if (n.nnodes == 1) return Status::ok();
  if (n.dist_init_addr.empty()) {
    return invalid_argument("--nnodes " + std::to_string(n.nnodes) +
                            " needs --dist-init-addr HOST:PORT (node 0's address)");
  }
  M3_RETURN_IF_ERROR(parse_dist_init_addr(n.dist_init_addr).status());
  if (tp % n.nnodes != 0) {
    return invalid_argument("--tp " + std::to_string(tp) + " is not a multiple of --nnodes " +
                            std::to_string(n.nnodes) +
                            ": every node holds the same number of ranks");
  }
  if (n.dist_timeout.count() < 1) return invalid_argument("--dist-timeout must be >= 1 second");
  return Status::ok();
}

Result<JoinedRanks> join_nodes(const NodeLayout& n, int tp, int dp) {
  M3_RETURN_IF_ERROR(check_node_layout(n, tp));
  if (dp < 1 || tp % dp != 0) {
    return invalid_argument("--dp " + std::to_string(dp) + " must divide --tp " +
                            std::to_string(tp));
  }
  const int attn_tp = tp / dp;
  const bool attn_groups = dp > 1 && attn_tp > 1;
  M3_ASSIGN_OR_RETURN(std::shared_ptr<Rendezvous> rv, open_rendezvous(n, dp));
  M3_ASSIGN_OR_RETURN(auto host_port, parse_dist_init_addr(n.dist_init_addr));
  const auto& [host, port] = host_port;
  const std::chrono::milliseconds timeout = n.dist_timeout;
  const NodeRanks mine = node_ranks(tp, n.nnodes, n.node_rank);
  const int per_node = mine.count;
  const int first = mine.first;
  comm::GlooOptions gloo;
  gloo.timeout = timeout;
  gloo.hostname = local_address_toward(host, port);
  for (int i = 0; i < per_node; ++i) {
    M3_ASSIGN_OR_RETURN(std::shared_ptr<comm::TcpStore> c,
                        comm::TcpStore::connect(host, port, timeout));
    rv->rank_stores.push_back(std::move(c));
  }
  // Each rank blocks until the whole group has joined: join them concurrently. A rank then joins
  // its attention group, whose other ranks (here or on other nodes) do the same after their own
  // world join.
  std::vector<Result<std::unique_ptr<comm::Communicator>>> joined, attn_joined;
  for (int i = 0; i < per_node; ++i) {
    joined.emplace_back(internal_error("not joined"));
    attn_joined.emplace_back(internal_error("not joined"));
  }
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < per_node; ++i) {
      threads.emplace_back([&, i] {
        const size_t k = static_cast<size_t>(i);
        const int rank = first + i;
        joined[k] = comm::create_gloo_communicator(rank, tp,
                                                   rv->rank_stores[k]->gloo_store(timeout), gloo);
        if (!joined[k].is_ok() || !attn_groups) return;
        const std::string prefix = "m3/attn" + std::to_string(rank / attn_tp) + "/";
        attn_joined[k] = comm::create_gloo_communicator(
            rank % attn_tp, attn_tp, rv->rank_stores[k]->gloo_store(timeout, prefix), gloo);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  JoinedRanks out;
  out.ranks.first = first;
  const auto failed = [&](const Status& s, const std::string& group) {
    return Status(s.code(), "node " + std::to_string(n.node_rank) + " of " +
                                std::to_string(n.nnodes) + " (--dist-init-addr " +
                                n.dist_init_addr + ")" + group + ": " + s.message());
  };
  for (auto& c : joined) {
    if (!c.is_ok()) return failed(c.status(), "");
    out.ranks.comms.push_back(std::move(c).value());
  }
  for (int i = 0; attn_groups && i < per_node; ++i) {
    auto& c = attn_joined[static_cast<size_t>(i)];
    if (!c.is_ok()) {
      return failed(c.status(), ", attention group " + std::to_string((first + i) / attn_tp) +
                                    " (--dp " + std::to_string(dp) + ")");
    }
    out.ranks.attn_comms.push_back(std::move(c).value());
  }
  out.ranks.keepalive = rv;
  out.share_kv_pages = [rv, n](int32_t pages) -> Result<int32_t> {
    std::vector<char> mine(sizeof(pages));
    std::memcpy(mine.data(), &pages, sizeof(pages));
    M3_ASSIGN_OR_RETURN(std::vector<char> v,
                        publish_or_read(*rv, n, "m3/kv_pages", mine, "KV page count"));
    if (v.size() != sizeof(int32_t)) return internal_error("[multi_node] bad page count");
    int32_t got = 0;
    std::memcpy(&got, v.data(), sizeof(got));
    return got;
  };
  out.nodes_gone = nodes_gone_fn(rv, n.nnodes, per_node);
  return out;
}

NodeRanks node_ranks(int tp, int nnodes, int node_rank) {
  const int per_node = tp / std::max(1, nnodes);
  return NodeRanks{node_rank * per_node, per_node};
}

Result<std::shared_ptr<JoinedGpuNodes>> join_gpu_nodes(const NodeLayout& n, int tp, int dp) {
  M3_RETURN_IF_ERROR(check_node_layout(n, tp));
  if (n.nnodes < 2) return invalid_argument("[multi_node] join_gpu_nodes needs --nnodes >= 2");
  M3_ASSIGN_OR_RETURN(std::shared_ptr<Rendezvous> rv, open_rendezvous(n, dp));
  M3_ASSIGN_OR_RETURN(auto host_port, parse_dist_init_addr(n.dist_init_addr));
  const auto& [host, port] = host_port;
  // The step group's own connection: Gloo's rendezvous waits on it while the node's main
  // connection may be asked for other keys.
  M3_ASSIGN_OR_RETURN(std::shared_ptr<comm::TcpStore> c,
                      comm::TcpStore::connect(host, port, n.dist_timeout));
  rv->rank_stores.push_back(c);
  comm::GlooOptions gloo;
  gloo.timeout = n.dist_timeout;
  gloo.hostname = local_address_toward(host, port);
  auto out = std::make_shared<JoinedGpuNodes>();
  Result<std::unique_ptr<comm::Communicator>> steps = comm::create_gloo_communicator(
      n.node_rank, n.nnodes, c->gloo_store(n.dist_timeout, "m3/steps/"), gloo);
  if (!steps.is_ok()) {
    return Status(steps.status().code(),
                  "node " + std::to_string(n.node_rank) + " of " + std::to_string(n.nnodes) +
                      " (--dist-init-addr " + n.dist_init_addr + "), the nodes' step group: " +
                      steps.status().message());
  }
  out->steps = std::move(steps).value();
  out->ranks = node_ranks(tp, n.nnodes, n.node_rank);
  out->nnodes = n.nnodes;
  out->node_rank = n.node_rank;
  out->keepalive = rv;
  out->share_unique_id = [rv, n](const std::vector<char>& id) {
    return publish_or_read(*rv, n, "m3/nccl_unique_id", id, "NCCL unique id");
  };
  out->share_pool = [rv, n](const GpuPoolShare& mine) -> Result<GpuPoolShare> {
    std::vector<char> bytes(sizeof(GpuPoolShare));
    std::memcpy(bytes.data(), &mine, sizeof(mine));
    M3_ASSIGN_OR_RETURN(std::vector<char> v,
                        publish_or_read(*rv, n, "m3/gpu_pool", bytes, "KV pool sizing"));
    if (v.size() != sizeof(GpuPoolShare)) return internal_error("[multi_node] bad pool sizing");
    GpuPoolShare got;
    std::memcpy(&got, v.data(), sizeof(got));
    return got;
  };
  out->nodes_gone = nodes_gone_fn(rv, n.nnodes, out->ranks.count);
  return out;
}

int end_following(const NodeLayout& nodes, const Status& s,
                  const std::function<std::string()>& nodes_gone) {
  if (s.is_ok()) {
    std::fprintf(stderr, "m3serve: node %d of %d: node 0 shut down; exiting\n", nodes.node_rank,
                 nodes.nnodes);
    return 0;
  }
  const std::string who = nodes_gone ? nodes_gone() : std::string();
  std::fprintf(stderr, "m3serve: fatal: node %d of %d: %s%s; exiting\n", nodes.node_rank,
               nodes.nnodes, who.empty() ? "" : (who + ": ").c_str(), s.message().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace m3::app
