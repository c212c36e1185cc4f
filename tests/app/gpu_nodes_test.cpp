// GPU ranks over several nodes without GPUs (app/gpu_nodes.h): node 0's make_engine and node 1's
// run_follower_node, each on its own thread as two processes would be, meet at the rendezvous and
// reach the real-shape runner's factory with their node's share of the ranks (the first rank and
// the count, the step group, the unique id's exchange) and the flags; node 1's factory gets the
// planner that offers what its GPUs hold; with --enable-dp-attention --dp too.
#include "app/gpu_nodes.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "backend/comm/tcp_store.h"
#include "model/step_channel.h"

namespace m3::app {
namespace {

std::string free_addr() {
  auto probe = comm::TcpStoreServer::start("127.0.0.1", 0);
  EXPECT_TRUE(probe.is_ok());
  return "127.0.0.1:" + std::to_string((*probe)->port());
}

// What node 1's factory returns: a runner that follows nothing and reports node 0 shut down.
class FakeFollower final : public ModelRunner, public StepFollower {
 public:
  int32_t vocab_size() const override { return 8; }
  int32_t hidden_size() const override { return 8; }
  int32_t num_kv_pages() const override { return 3; }
  int32_t page_size() const override { return 128; }
  Status forward(const ModelStep&, ModelOutput&) override {
    return internal_error("a follower runs no engine step");
  }
  Status follow() override {
    ++*follows;
    return Status::ok();
  }
  // Outlives the runner, which follow_on_gpus destroys before it returns.
  std::shared_ptr<int> follows = std::make_shared<int>(0);
};

EngineStackOptions gpu_node(int node_rank, const std::string& addr) {
  EngineStackOptions o;
  o.device = "cuda";
  o.dummy_weights = true;  // the built-in MiniMax-M3.1-Flash config
  o.num_layers = 2;
  o.tensor_parallel = 2;
  o.expert_parallel = 2;
  o.nodes.nnodes = 2;
  o.nodes.node_rank = node_rank;
  o.nodes.dist_init_addr = addr;
  o.nodes.dist_timeout = std::chrono::seconds(20);
  o.decode_max_rows = 64;
  o.custom_all_reduce = true;
  o.make_backend = [](const std::string&, int) -> Result<std::unique_ptr<Backend>> {
    return Status(StatusCode::kInternal, "the float32 backend is not used by GPU ranks");
  };
  return o;
}

// Node 0's make_engine and node 1's run_follower_node on their own threads, as two processes;
// node 0's factory stops there, node 1's returns a FakeFollower. What each factory was asked for.
struct TwoNodes {
  CudaKvPoolRequest seen0, seen1;
  std::shared_ptr<int> follows;  // the fake follower's follow() calls
  Result<LoadedEngine> node0 = internal_error("not run");
  Result<int> node1 = internal_error("not run");
};

void meet(EngineStackOptions o0, EngineStackOptions o1, TwoNodes* out) {
  o0.make_cuda_runner = [out](const MiniMaxM3Config&, const WeightSource&,
                              const CudaKvPoolRequest& pool) -> Result<std::unique_ptr<ModelRunner>> {
    out->seen0 = pool;
    return Status(StatusCode::kUnavailable, "stop here");
  };
  o1.make_cuda_runner = [out](const MiniMaxM3Config& cfg, const WeightSource&,
                              const CudaKvPoolRequest& pool) -> Result<std::unique_ptr<ModelRunner>> {
    out->seen1 = pool;
    EXPECT_EQ(cfg.num_attention_heads, 64) << "the factory gets the whole model's config";
    auto f = std::make_unique<FakeFollower>();
    out->follows = f->follows;
    return std::unique_ptr<ModelRunner>(std::move(f));
  };
  std::thread t0([&] { out->node0 = make_engine("", o0); });
  std::thread t1([&] { out->node1 = run_follower_node("", o1); });
  t0.join();
  t1.join();
  ASSERT_FALSE(out->node0.is_ok());
  EXPECT_EQ(out->node0.status().message(), "stop here");
  ASSERT_TRUE(out->node1.is_ok()) << out->node1.status().to_string();
  EXPECT_EQ(*out->node1, 0) << "node 0 'shut down' (the fake follower's follow() returned ok)";
  ASSERT_NE(out->follows, nullptr);
  EXPECT_EQ(*out->follows, 1);
  for (const CudaKvPoolRequest* p : {&out->seen0, &out->seen1}) {
    ASSERT_NE(p->nodes, nullptr);
    ASSERT_NE(p->nodes->steps, nullptr);
    EXPECT_EQ(p->nodes->steps->size(), 2);
    EXPECT_TRUE(p->nodes->share_unique_id != nullptr);
    EXPECT_TRUE(p->nodes->share_pool != nullptr);
    EXPECT_EQ(p->nodes->ranks.count, 1);
  }
  EXPECT_EQ(out->seen0.nodes->ranks.first, 0);
  EXPECT_EQ(out->seen0.nodes->steps->rank(), 0);
  EXPECT_EQ(out->seen1.nodes->ranks.first, 1);
  EXPECT_EQ(out->seen1.nodes->steps->rank(), 1);
}

TEST(GpuNodes, BothNodesReachTheCudaRunnerWithTheirShare) {
  const std::string addr = free_addr();
  EngineStackOptions o0 = gpu_node(0, addr), o1 = gpu_node(1, addr);
  // 10 pages of one GPU's share (2 layers x 128 tokens x (2 of the 4 KV heads' K and V + the
  // index key) x 128 dims x 2 bytes), as in ServeFlags.GpuTensorParallelReachesTheCudaRunner.
  o0.kv_cache_bytes = 10 * 2 * 128 * (2 * 2 * 128 + 128) * 2;
  TwoNodes two;
  ASSERT_NO_FATAL_FAILURE(meet(o0, o1, &two));
  for (const CudaKvPoolRequest* p : {&two.seen0, &two.seen1}) {
    EXPECT_EQ(p->tensor_parallel, 2);
    EXPECT_EQ(p->expert_parallel, 2);
    EXPECT_EQ(p->dp_attention, 1);
    EXPECT_EQ(p->dist_timeout, std::chrono::seconds(20));
    EXPECT_EQ(p->max_decode_rows, 64);
    EXPECT_TRUE(p->custom_all_reduce);
    EXPECT_EQ(p->kv_cache_dtype, KvCacheDtype::kBF16);
  }
  // Node 0 sizes the pool (here by --kv-cache-bytes); node 1 brings none of its own and offers,
  // after a profile step, what its GPU holds.
  EXPECT_EQ(two.seen0.kv_cache_bytes, o0.kv_cache_bytes);
  EXPECT_EQ(two.seen1.kv_cache_bytes, 0)
      << "node 1 gave no --kv-cache-bytes (the factory takes node 0's)";
  ASSERT_TRUE(two.seen1.plan_pool_bytes != nullptr);
  MeasuredMemory m{80'000'000'000, 30'000'000'000, 5'000'000'000, 40'000'000'000};
  auto offered = two.seen1.plan_pool_bytes(m);
  ASSERT_TRUE(offered.is_ok());
  EXPECT_EQ(*offered, m.free_bytes - kv_headroom_bytes(m.total_bytes));
  EXPECT_EQ(follower_pool_bytes(MeasuredMemory{80, 0, 0, 1}), 0) << "never negative";
}

// --tp 2 --enable-dp-attention --dp 2 over two GPU nodes: each node's GPU is one attention group
// (rank 0 group 0 on node 0, rank 1 group 1 on node 1). No collective over nodes beyond --tp's:
// the attention all-reduce over all ranks brings rank 0 every group's rows. Both nodes reach the
// factory with the same dp (node 1's GPUs load their group's heads and pool and run the steps
// node 0 sends, each slice naming its group on the wire).
TEST(GpuNodes, DataParallelAttentionReachesTheCudaRunnerOnBothNodes) {
  const std::string addr = free_addr();
  EngineStackOptions o0 = gpu_node(0, addr), o1 = gpu_node(1, addr);
  for (EngineStackOptions* o : {&o0, &o1}) {
    o->expert_parallel = 1;
    o->dp_attention = 2;
  }
  // 10 pages of one GPU's share: its group (one GPU) holds all 4 KV heads.
  o0.kv_cache_bytes = 10 * 2 * 128 * (4 * 2 * 128 + 128) * 2;
  TwoNodes two;
  ASSERT_NO_FATAL_FAILURE(meet(o0, o1, &two));
  for (const CudaKvPoolRequest* p : {&two.seen0, &two.seen1}) {
    EXPECT_EQ(p->tensor_parallel, 2);
    EXPECT_EQ(p->expert_parallel, 1);
    EXPECT_EQ(p->dp_attention, 2);
    EXPECT_EQ(p->dist_timeout, std::chrono::seconds(20));
    EXPECT_EQ(p->kv_cache_dtype, KvCacheDtype::kBF16);
  }
  EXPECT_EQ(two.seen0.kv_cache_bytes, o0.kv_cache_bytes);
  EXPECT_EQ(two.seen1.kv_cache_bytes, 0);
  EXPECT_TRUE(two.seen1.plan_pool_bytes != nullptr);
}

}  // namespace
}  // namespace m3::app
