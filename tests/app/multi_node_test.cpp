// The multi-node flags' checks (app/multi_node.h) and two "nodes" joining in one process: each
// error names the flag, and joined ranks form one group that carries a collective and the KV
// page count.
#include "app/multi_node.h"

#include <gtest/gtest.h>

#include <thread>

#include "backend/comm/tcp_store.h"

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

}  // namespace
}  // namespace m3::app
