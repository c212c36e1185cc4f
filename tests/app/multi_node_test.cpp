// The multi-node flags' checks (app/multi_node.h) and "nodes" joining in one process: each error
// names the flag, joined ranks form one group that carries a collective and the KV page count,
// and with --dp each rank also joins its attention group, which may span nodes. GPU ranks' nodes
// (join_gpu_nodes) hand out the NCCL unique id (a made-up one here) and the pool's sizing through
// the rendezvous, within --dist-timeout, and carry the steps over their step group.
#include "app/multi_node.h"

#include <gtest/gtest.h>

#include <thread>

#include "backend/comm/tcp_store.h"
#include "model/step_channel.h"

namespace m3::app {
namespace {

NodeLayout layout(int nnodes, int node_rank, std::string addr) {
  NodeLayout n;
  n.nnodes = nnodes;
  n.node_rank = node_rank;
  n.dist_init_addr = std::move(addr);
  n.dist_timeout = std::chrono::seconds(10);
  return n;
}

void expect_error(const Status& s, const std::string& names) {
  ASSERT_FALSE(s.is_ok()) << names;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(names), std::string::npos) << s.message();
}

TEST(MultiNode, FlagsAreCheckedNamingThem) {
  EXPECT_TRUE(check_node_layout(layout(1, 0, ""), 4).is_ok());
  EXPECT_TRUE(check_node_layout(layout(2, 1, "10.0.0.1:5000"), 4).is_ok());
  expect_error(check_node_layout(layout(2, 0, ""), 4), "--dist-init-addr");
  expect_error(check_node_layout(layout(2, 2, "10.0.0.1:5000"), 4), "--node-rank 2");
  expect_error(check_node_layout(layout(3, 0, "10.0.0.1:5000"), 4), "--nnodes 3");
  expect_error(check_node_layout(layout(0, 0, ""), 4), "--nnodes 0");
  for (const char* bad : {"10.0.0.1", "10.0.0.1:", ":5000", "host:0", "host:70000", "host:5x"}) {
    expect_error(check_node_layout(layout(2, 0, bad), 4), "--dist-init-addr");
  }
  auto hp = parse_dist_init_addr("node-a.example:29500");
  ASSERT_TRUE(hp.is_ok());
  EXPECT_EQ(hp->first, "node-a.example");
  EXPECT_EQ(hp->second, 29500);
}

TEST(MultiNode, TwoNodesJoinOneGroupAndShareThePageCount) {
  // A port that was free a moment ago.
  auto probe = comm::TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(probe.is_ok());
  const std::string addr = "127.0.0.1:" + std::to_string((*probe)->port());
  probe->reset();
  Result<JoinedRanks> node0 = internal_error("not run"), node1 = internal_error("not run");
  std::thread t0([&] { node0 = join_nodes(layout(2, 0, addr), 4); });
  std::thread t1([&] { node1 = join_nodes(layout(2, 1, addr), 4); });
  t0.join();
  t1.join();
  ASSERT_TRUE(node0.is_ok()) << node0.status().to_string();
  ASSERT_TRUE(node1.is_ok()) << node1.status().to_string();
  EXPECT_EQ(node0->ranks.first, 0);
  EXPECT_EQ(node1->ranks.first, 2);
  ASSERT_EQ(node0->ranks.comms.size(), 2u);
  ASSERT_EQ(node1->ranks.comms.size(), 2u);
  EXPECT_TRUE(node0->ranks.attn_comms.empty());  // no --dp: attention over the world group
  // Every rank sums its rank number: 0 + 1 + 2 + 3.
  std::vector<std::thread> ranks;
  std::vector<float> sums(4, -1);
  auto run = [&](comm::Communicator* c) {
    float v = static_cast<float>(c->rank());
    EXPECT_TRUE(c->all_reduce(&v, 1, comm::DataType::kF32, comm::ReduceOp::kSum).is_ok());
    sums[static_cast<size_t>(c->rank())] = v;
  };
  for (auto* n : {&*node0, &*node1})
    for (auto& c : n->ranks.comms) ranks.emplace_back(run, c.get());
  for (std::thread& t : ranks) t.join();
  for (float s : sums) EXPECT_EQ(s, 6.0f);
  auto published = node0->share_kv_pages(1234);
  auto read = node1->share_kv_pages(0);
  ASSERT_TRUE(published.is_ok() && read.is_ok());
  EXPECT_EQ(*read, 1234);
  EXPECT_EQ(node0->nodes_gone(), "");
}

// A free loopback address for a rendezvous.
std::string free_addr() {
  auto probe = comm::TcpStoreServer::start("127.0.0.1", 0);
  EXPECT_TRUE(probe.is_ok());
  return "127.0.0.1:" + std::to_string((*probe)->port());
}

TEST(MultiNode, RanksAreNumberedNodeByNode) {
  auto eq = [](NodeRanks r, int first, int count) {
    EXPECT_EQ(r.first, first);
    EXPECT_EQ(r.count, count);
  };
  eq(node_ranks(2, 2, 0), 0, 1);
  eq(node_ranks(2, 2, 1), 1, 1);
  eq(node_ranks(4, 2, 1), 2, 2);
  eq(node_ranks(8, 4, 3), 6, 2);
  eq(node_ranks(16, 2, 1), 8, 8);
}

// Two nodes of GPU ranks (--tp 4, two GPUs each): node 0 publishes the NCCL unique id and the
// pool's sizing, node 1 reads them; steps go from node 0 to node 1 over the nodes' step group,
// then the stop. A node that dies is named by the other's nodes_gone().
TEST(MultiNode, GpuNodesShareTheUniqueIdThePoolAndTheSteps) {
  const std::string addr = free_addr();
  Result<std::shared_ptr<JoinedGpuNodes>> node0 = internal_error("not run"),
                                          node1 = internal_error("not run");
  std::thread t0([&] { node0 = join_gpu_nodes(layout(2, 0, addr), 4); });
  std::thread t1([&] { node1 = join_gpu_nodes(layout(2, 1, addr), 4); });
  t0.join();
  t1.join();
  ASSERT_TRUE(node0.is_ok()) << node0.status().to_string();
  ASSERT_TRUE(node1.is_ok()) << node1.status().to_string();
  JoinedGpuNodes& n0 = **node0;
  JoinedGpuNodes& n1 = **node1;
  EXPECT_EQ(n0.ranks.first, 0);
  EXPECT_EQ(n0.ranks.count, 2);
  EXPECT_EQ(n1.ranks.first, 2);
  EXPECT_EQ(n1.ranks.count, 2);
  ASSERT_NE(n0.steps, nullptr);
  EXPECT_EQ(n0.steps->rank(), 0);
  EXPECT_EQ(n1.steps->rank(), 1);
  EXPECT_EQ(n1.steps->size(), 2);

  // A made-up 128-byte id (ncclUniqueId's size), as the GPU runner of rank 0 would pass it.
  std::vector<char> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7 + 3);
  auto published = n0.share_unique_id(id);
  ASSERT_TRUE(published.is_ok()) << published.status().to_string();
  EXPECT_EQ(*published, id);
  auto fetched = n1.share_unique_id({});
  ASSERT_TRUE(fetched.is_ok()) << fetched.status().to_string();
  EXPECT_EQ(*fetched, id);

  auto pool0 = n0.share_pool(GpuPoolShare{0, 4096});
  ASSERT_TRUE(pool0.is_ok());
  auto pool1 = n1.share_pool(GpuPoolShare{123, 0});  // node 1's own flags do not count
  ASSERT_TRUE(pool1.is_ok()) << pool1.status().to_string();
  EXPECT_EQ(pool1->kv_cache_bytes, 0);
  EXPECT_EQ(pool1->profile_tokens, 4096);

  // A step, then the stop, as CudaM3ModelRunner sends them.
  const std::vector<int32_t> tokens = {5, 6, 7}, table = {3};
  ModelStep step;
  step.slices.resize(1);
  step.slices[0].tokens = tokens;
  step.slices[0].start_pos = 9;
  step.slices[0].block_table = table;
  step.slices[0].logits_rows = {2};
  std::thread sender([&] {
    EXPECT_TRUE(send_step(*n0.steps, &step).is_ok());
    EXPECT_TRUE(send_step(*n0.steps, nullptr).is_ok());
  });
  auto got = receive_step(*n1.steps, n1.idle_wait);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_TRUE(got->has_value());
  const ModelStep& st = (**got).step;
  ASSERT_EQ(st.slices.size(), 1u);
  EXPECT_EQ(std::vector<int32_t>(st.slices[0].tokens.begin(), st.slices[0].tokens.end()), tokens);
  EXPECT_EQ(st.slices[0].start_pos, 9);
  EXPECT_EQ(st.slices[0].logits_rows, std::vector<int32_t>{2});
  auto stop = receive_step(*n1.steps, n1.idle_wait);
  ASSERT_TRUE(stop.is_ok()) << stop.status().to_string();
  EXPECT_FALSE(stop->has_value());
  sender.join();

  EXPECT_EQ(n0.nodes_gone(), "");
  node1 = internal_error("node 1 is gone");  // its connections close, as when it is killed
  EXPECT_EQ(n0.nodes_gone(), "node 1 (ranks 2..3) left the rendezvous");
}

// A node whose node 0 never publishes the unique id gives up after --dist-timeout, naming the
// address and what it waited for.
TEST(MultiNode, GpuNodesWaitForTheUniqueIdWithinTheTimeout) {
  const std::string addr = free_addr();
  NodeLayout l0 = layout(2, 0, addr), l1 = layout(2, 1, addr);
  l0.dist_timeout = l1.dist_timeout = std::chrono::seconds(1);
  Result<std::shared_ptr<JoinedGpuNodes>> node0 = internal_error("not run"),
                                          node1 = internal_error("not run");
  std::thread t0([&] { node0 = join_gpu_nodes(l0, 2); });
  node1 = join_gpu_nodes(l1, 2);
  t0.join();
  ASSERT_TRUE(node0.is_ok()) << node0.status().to_string();
  ASSERT_TRUE(node1.is_ok()) << node1.status().to_string();
  const auto t = std::chrono::steady_clock::now();
  auto id = (*node1)->share_unique_id({});
  const auto waited = std::chrono::steady_clock::now() - t;
  ASSERT_FALSE(id.is_ok());
  EXPECT_EQ(id.status().code(), StatusCode::kUnavailable);
  for (const std::string& named : {std::string("node 1: no NCCL unique id from node 0"),
                                   "--dist-init-addr " + addr, std::string("--dist-timeout 1 s")})
    EXPECT_NE(id.status().message().find(named), std::string::npos) << id.status().message();
  EXPECT_GE(waited, std::chrono::milliseconds(900));
  EXPECT_LT(waited, std::chrono::seconds(10));
  // Without node 0 at all, joining fails after the timeout naming the address.
  NodeLayout alone = layout(2, 1, free_addr());
  alone.dist_timeout = std::chrono::seconds(1);
  auto lonely = join_gpu_nodes(alone, 2);
  ASSERT_FALSE(lonely.is_ok());
  EXPECT_NE(lonely.status().message().find(alone.dist_init_addr), std::string::npos)
      << lonely.status().message();
}

// --tp 4 --dp 2 over four one-rank nodes: the attention groups {0, 1} and {2, 3} each span two
// nodes; they rendezvous through the world's store under their own keys, next to the world group.
TEST(MultiNode, AttentionGroupsJoinAcrossNodes) {
  auto probe = comm::TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(probe.is_ok());
  const std::string addr = "127.0.0.1:" + std::to_string((*probe)->port());
  probe->reset();
  constexpr int kNodes = 4;
  std::vector<Result<JoinedRanks>> nodes;
  for (int k = 0; k < kNodes; ++k) nodes.emplace_back(internal_error("not run"));
  {
    std::vector<std::thread> threads;
    // Four nodes' ranks and two groups' rendezvous on a loaded 2-core CI machine once took over
    // the 10 s the other tests allow (every collective then timed out): a minute here.
    for (int k = 0; k < kNodes; ++k)
      threads.emplace_back([&, k] {
        NodeLayout n = layout(kNodes, k, addr);
        n.dist_timeout = std::chrono::seconds(60);
        nodes[static_cast<size_t>(k)] = join_nodes(n, 4, 2);
      });
    for (std::thread& t : threads) t.join();
  }
  std::vector<comm::Communicator*> world, attn;
  for (auto& n : nodes) {
    ASSERT_TRUE(n.is_ok()) << n.status().to_string();
    ASSERT_EQ(n->ranks.comms.size(), 1u);
    ASSERT_EQ(n->ranks.attn_comms.size(), 1u);
    world.push_back(n->ranks.comms[0].get());
    attn.push_back(n->ranks.attn_comms[0].get());
  }
  for (int r = 0; r < kNodes; ++r) {
    EXPECT_EQ(attn[static_cast<size_t>(r)]->rank(), r % 2);
    EXPECT_EQ(attn[static_cast<size_t>(r)]->size(), 2);
  }
  // Each rank sums 1 + its rank over its attention group, then over the world.
  std::vector<float> group_sums(kNodes, -1), world_sums(kNodes, -1);
  {
    std::vector<std::thread> ranks;
    for (int r = 0; r < kNodes; ++r) {
      ranks.emplace_back([&, r] {
        const size_t k = static_cast<size_t>(r);
        float v = 1.0f + static_cast<float>(r);
        EXPECT_TRUE(attn[k]->all_reduce(&v, 1, comm::DataType::kF32, comm::ReduceOp::kSum).is_ok());
        group_sums[k] = v;
        float w = 1.0f + static_cast<float>(r);
        EXPECT_TRUE(world[k]->all_reduce(&w, 1, comm::DataType::kF32, comm::ReduceOp::kSum).is_ok());
        world_sums[k] = w;
      });
    }
    for (std::thread& t : ranks) t.join();
  }
  EXPECT_EQ(group_sums, (std::vector<float>{3, 3, 7, 7}));
  EXPECT_EQ(world_sums, (std::vector<float>{10, 10, 10, 10}));
  // A node started with another --dp than node 0 is refused, naming both.
  {
    auto probe2 = comm::TcpStoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(probe2.is_ok());
    const std::string addr2 = "127.0.0.1:" + std::to_string((*probe2)->port());
    probe2->reset();
    NodeLayout n0 = layout(2, 0, addr2), n1 = layout(2, 1, addr2);
    n0.dist_timeout = n1.dist_timeout = std::chrono::seconds(2);
    Result<JoinedRanks> node0 = internal_error("not run"), node1 = internal_error("not run");
    std::thread t0([&] { node0 = join_nodes(n0, 4, 2); });
    node1 = join_nodes(n1, 4, 1);
    ASSERT_FALSE(node1.is_ok());
    expect_error(node1.status(), "node 1: --dp 1 (with --enable-dp-attention) but node 0 serves "
                                 "--dp 2");
    t0.join();  // node 0 gives up after --dist-timeout: node 1 never joined
    EXPECT_FALSE(node0.is_ok());
  }
  // A --dp that does not divide --tp is refused before anything is joined, naming both.
  expect_error(join_nodes(layout(2, 0, addr), 4, 3).status(), "--dp 3 must divide --tp 4");
}

}  // namespace
}  // namespace m3::app
