// Attention data parallelism on GPU ranks (CudaM3ModelRunner, --tp T --enable-dp-attention
// --dp D; cuda_m3_model.h, CudaTensorParallel::dp): D groups of T/D ranks, each running attention
// on its own slices over its own KV pool, the feed-forward blocks over all T ranks on every
// group's rows. Checked against the CPU ranks under the same layout (TensorParallelCpuRunner,
// the semantics' reference: group all-reduce, all-gather, feed-forward all-reduce) on the weights
// and error model of cuda_tensor_parallel_test.cpp (real_model_fixture.h), with the same bound,
// and a vocabulary that splits unevenly over the ranks (dp_test_config).
//
// The steps: both groups prefilling (slices interleaved over the groups), group 0 decoding while
// group 1 prefills a chunk beside a decode row, group 1 empty while group 0 decodes and prefills a
// new sequence, group 0 empty, then decode steps at batch 4 with one group empty now and then
// (its rows all padding in the same CUDA graph). The groups' page ids overlap (each group has its
// own pool): a group writing the other's pages would show.
//
// On one GPU (always) every runner has its ranks on GPU 0:
//  * host-staged: every collective staged through the host over an in-process Gloo group
//    (host_staged_communicator.h), launches eager (not the one-shot all-reduce: see
//    one_gpu_case);
//  * two nodes (--nnodes 2, CudaRanks::nodes): --tp 2 --dp 2 as two runners of one rank (one
//    group) each, node 1 following node 0's steps over a Gloo step group, host-staged; bit for
//    bit the in-process host-staged runner's on the decode steps.
// On two GPUs (CudaDpAttentionNccl, needs 2): --tp 2 --dp 2 over NCCL with the one-shot fused
// all-reduce + norm, graphs against eager, bit for bit, and against the CPU ranks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/comm/gloo_communicator.h"
#include "host_staged_communicator.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"
#include "model/minimax_m3/cuda/cuda_m3_runner.h"
#include "model/minimax_m3/cuda/fit_check.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "model/minimax_m3/tensor_parallel_runner.h"
#include "real_model_fixture.h"

namespace m3 {
namespace {

using minimax_m3::CudaM3Model;
using minimax_m3::CudaM3Options;
using real_model_fixture::Compare;
using real_model_fixture::last_argmax;
using real_model_fixture::random_tokens;
using real_model_fixture::Seq;
using real_model_fixture::test_config;
using real_model_fixture::TestSource;

constexpr int64_t kPages = 48;  // per group

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

enum class Comm { kHostStaged, kNccl };

// test_config with a vocabulary that no rank count here divides (2045 = 5 x 409): the ranks'
// vocabulary slices of the embedding and head differ by a row (1023 + 1022; 512 + 3 x 511), so
// the head's all-gather carries a padding column that must be dropped.
MiniMaxM3Config dp_test_config() {
  MiniMaxM3Config c = test_config();
  c.vocab_size = 2045;
  return c;
}

class DpHarness {
 public:
  DpHarness() : cfg_(dp_test_config()), src_(cfg_) {}

  const MiniMaxM3Config& cfg() const { return cfg_; }
  const WeightSource& src() const { return src_; }
  double rel_bound() const { return real_model_fixture::rel_bound(cfg_); }

  // --tp tp --dp dp on GPU 0 (host-staged) or on GPUs 0 .. tp-1 over NCCL.
  Result<std::unique_ptr<CudaM3ModelRunner>> runner(int tp, int dp, Comm comm, bool graphs) {
    CudaM3Options o;
    o.max_batch = 16;
    o.use_graphs = graphs;
    CudaRanks ranks;
    ranks.ranks = tp;
    ranks.dp = dp;
    ranks.timeout = std::chrono::seconds(60);
    if (comm != Comm::kNccl) {
      ranks.devices.assign(static_cast<size_t>(tp), 0);
      M3_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<comm::Communicator>> hosts,
                          comm::create_local_gloo_group(tp));
      auto shared = std::make_shared<std::vector<std::unique_ptr<comm::Communicator>>>(
          std::move(hosts));
      ranks.make_communicator = [shared](int r, int device, CUstream_st* stream)
          -> Result<std::unique_ptr<comm::Communicator>> {
        return std::unique_ptr<comm::Communicator>(std::make_unique<testing::HostStagedCommunicator>(
            std::move((*shared)[static_cast<size_t>(r)]), device, stream));
      };
    }
    const int64_t page_bytes =
        CudaM3Model::kv_bytes_per_page(cfg_, tp, 1, KvCacheDtype::kBF16, dp);
    return CudaM3ModelRunner::create(cfg_, src_, kPages * page_bytes, o, std::move(ranks));
  }

  // The CPU ranks under the same layout (float32 caches of kPages pages per group).
  Result<std::unique_ptr<TensorParallelCpuRunner>> cpu_ranks(int tp, int dp) {
    return TensorParallelCpuRunner::create(cfg_, src_, tp, 1, 2, static_cast<int32_t>(kPages), dp);
  }

 private:
  MiniMaxM3Config cfg_;
  TestSource src_;
};

DpHarness& harness() {
  static DpHarness h;
  return h;
}

// A sequence of one group: its pages (ids of the group's pool) and cached positions.
struct GroupSeq {
  Seq seq;
  int32_t group = 0;
};

// One slice of a step: a sequence and the tokens appended to it.
struct Part {
  GroupSeq* s;
  std::vector<int32_t> tokens;
};

// The step of `parts` (logits of every row when all_rows, else the last).
ModelStep make_step(const std::vector<Part>& parts, bool all_rows) {
  ModelStep st;
  for (const Part& p : parts) {
    ModelSlice in;
    in.tokens = p.tokens;
    in.start_pos = p.s->seq.cached;
    in.block_table = p.s->seq.table;
    in.dp_group = p.s->group;
    const int32_t n = static_cast<int32_t>(p.tokens.size());
    if (all_rows) {
      for (int32_t r = 0; r < n; ++r) in.logits_rows.push_back(r);
    } else {
      in.logits_rows = {n - 1};
    }
    st.slices.push_back(std::move(in));
  }
  return st;
}

struct RunnerCase {
  std::string name;
  CudaM3ModelRunner* runner;
  Compare all, decode;  // every step's rows; the decode-path steps' rows
};

// Runs the case's steps on the CPU ranks and every runner; each runner's logits against the CPU
// ranks' (all steps, and the decode steps apart); `bitwise` pairs of runners (graphs and eager,
// or one process and two nodes) whose decode steps' logits must be equal bit for bit.
void run_case(int tp, int dp, std::vector<RunnerCase>& runners,
              const std::vector<std::pair<size_t, size_t>>& bitwise) {
  DpHarness& h = harness();
  const int64_t v = h.cfg().vocab_size;
  auto cpu_or = h.cpu_ranks(tp, dp);
  ASSERT_TRUE(cpu_or.is_ok()) << cpu_or.status().to_string();
  TensorParallelCpuRunner& cpu = **cpu_or;
  ASSERT_EQ(cpu.dp_groups(), dp);
  for (RunnerCase& r : runners) r.all = r.decode = Compare{h.rel_bound()};
  // Each group's pool hands out the same page ids in the same order: the groups' tables overlap.
  real_model_fixture::PageIds pages0(kPages, 7), pages1(kPages, 7);
  GroupSeq a{pages0.new_seq(600), 0}, b{pages0.new_seq(300), 0};
  GroupSeq c{pages1.new_seq(400), 1}, d{pages1.new_seq(700), 1};
  EXPECT_EQ(a.seq.table[0], c.seq.table[0]) << "the groups reuse page ids";
  int64_t bitwise_rows = 0, bitwise_bad = 0;
  ModelOutput ref;
  std::vector<ModelOutput> outs(runners.size());
  const auto step = [&](const std::vector<Part>& parts, bool all_rows, bool decode_path,
                        const std::string& what) {
    const ModelStep st = make_step(parts, all_rows);
    ref = {};
    Status s = cpu.forward(st, ref);
    ASSERT_TRUE(s.is_ok()) << what << ": " << s.to_string();
    ASSERT_EQ(ref.logits.size(), parts.size());
    for (size_t g = 0; g < runners.size(); ++g) {
      outs[g] = {};
      s = runners[g].runner->forward(st, outs[g]);
      ASSERT_TRUE(s.is_ok()) << runners[g].name << " " << what << ": " << s.to_string();
      ASSERT_EQ(outs[g].logits.size(), parts.size()) << runners[g].name << " " << what;
      Compare step_cmp{h.rel_bound()};
      for (size_t i = 0; i < parts.size(); ++i) {
        const std::vector<float>& want = ref.logits[i];
        const std::vector<float>& got = outs[g].logits[i];
        ASSERT_EQ(got.size(), want.size())
            << runners[g].name << " " << what << " slice " << i << " (group "
            << parts[i].s->group << ")";
        const int64_t rows = static_cast<int64_t>(want.size()) / v;
        step_cmp.rows_of(got.data(), want.data(), rows, v);
        runners[g].all.rows_of(got.data(), want.data(), rows, v);
        if (decode_path) runners[g].decode.rows_of(got.data(), want.data(), rows, v);
      }
      step_cmp.report(runners[g].name + " " + what);
      EXPECT_TRUE(step_cmp.ok()) << runners[g].name << " " << what;
    }
    if (decode_path)
      for (const auto& [graphs, eager] : bitwise)
        for (size_t i = 0; i < parts.size(); ++i) {
          ++bitwise_rows;
          if (std::memcmp(outs[graphs].logits[i].data(), outs[eager].logits[i].data(),
                          static_cast<size_t>(v) * sizeof(float)) != 0)
            ++bitwise_bad;
        }
    for (const Part& p : parts) p.s->seq.cached += static_cast<int64_t>(p.tokens.size());
  };
  // The greedy next token of slice i of the last step (the CPU ranks', teacher-forcing the GPUs).
  const auto next = [&](size_t i) { return std::vector<int32_t>{last_argmax(ref.logits[i], v)}; };

  // 1. Both groups prefill, their slices interleaved: c (group 1), a (group 0), d (group 1).
  ASSERT_NO_FATAL_FAILURE(step({{&c, random_tokens(250, v, 51)},
                                {&a, random_tokens(300, v, 52)},
                                {&d, random_tokens(180, v, 53)}},
                               true, false, "prefill, both groups"));
  std::vector<int32_t> na = next(1), nc = next(0);
  // 2. Group 0 decodes while group 1 prefills a chunk of d beside c's decode row.
  ASSERT_NO_FATAL_FAILURE(step({{&a, na}, {&d, random_tokens(220, v, 54)}, {&c, nc}}, true, false,
                               "group 0 decodes, group 1 prefills"));
  na = next(0);
  nc = next(2);
  std::vector<int32_t> nd = next(1);
  // 3. Group 1 empty: group 0 decodes a and prefills a new sequence b.
  ASSERT_NO_FATAL_FAILURE(step({{&b, random_tokens(120, v, 55)}, {&a, na}}, true, false,
                               "group 1 empty"));
  std::vector<int32_t> nb = next(0);
  na = next(1);
  // 4. Group 0 empty: group 1's two decode rows (the decode path).
  ASSERT_NO_FATAL_FAILURE(step({{&c, nc}, {&d, nd}}, false, true, "group 0 empty, decode"));
  nc = next(0);
  nd = next(1);
  // 5. Decode steps at batch 4; at steps 3 and 8 only group 1 decodes, at step 5 only group 0
  // (the same graph: every group padded to the largest group's two rows).
  for (int i = 0; i < 12; ++i) {
    const std::string what = "decode step " + std::to_string(i);
    if (i == 3 || i == 8) {
      ASSERT_NO_FATAL_FAILURE(step({{&d, nd}, {&c, nc}}, false, true, what + " (group 1 only)"));
      nd = next(0);
      nc = next(1);
    } else if (i == 5) {
      ASSERT_NO_FATAL_FAILURE(step({{&a, na}, {&b, nb}}, false, true, what + " (group 0 only)"));
      na = next(0);
      nb = next(1);
    } else {
      ASSERT_NO_FATAL_FAILURE(
          step({{&a, na}, {&c, nc}, {&b, nb}, {&d, nd}}, false, true, what));
      na = next(0);
      nc = next(1);
      nb = next(2);
      nd = next(3);
    }
  }
  const std::string layout = " --tp " + std::to_string(tp) + " --dp " + std::to_string(dp);
  for (RunnerCase& r : runners) {
    r.all.report(r.name + layout + " all steps vs CPU ranks");
    r.decode.report(r.name + layout + " decode steps vs CPU ranks");
    EXPECT_TRUE(r.all.ok()) << r.name;
    EXPECT_TRUE(r.decode.ok()) << r.name;
  }
  if (!bitwise.empty()) {
    std::string pairs;
    for (const auto& [x, y] : bitwise)
      pairs += (pairs.empty() ? " " : ", ") + runners[x].name + " vs " + runners[y].name;
    std::printf("[cuda_dp_attention]%s%s: %lld of %lld decode rows differ bitwise\n",
                layout.c_str(), pairs.c_str(), static_cast<long long>(bitwise_bad),
                static_cast<long long>(bitwise_rows));
    EXPECT_GT(bitwise_rows, 0);
    EXPECT_EQ(bitwise_bad, 0);
  }
}

// The runner's layout as loaded: D groups, a pool of kPages per group, each rank at its group's
// share of the heads and at 1/T of every intermediate dimension.
void check_layout(CudaM3ModelRunner& r, int tp, int dp) {
  const MiniMaxM3Config& whole = harness().cfg();
  EXPECT_EQ(r.num_ranks(), tp);
  EXPECT_EQ(r.dp_groups(), dp);
  EXPECT_EQ(r.num_kv_pages(), kPages);
  for (int rank = 0; rank < tp; ++rank) {
    const MiniMaxM3Config& rc = r.rank_model(rank).config();
    EXPECT_EQ(rc.num_attention_heads, whole.num_attention_heads / (tp / dp)) << rank;
    EXPECT_EQ(rc.num_key_value_heads,
              std::max<int64_t>(1, whole.num_key_value_heads / (tp / dp))) << rank;
    EXPECT_EQ(rc.intermediate_size, whole.intermediate_size / tp) << rank;
    EXPECT_EQ(rc.dense_intermediate_size, whole.dense_intermediate_size / tp) << rank;
    EXPECT_EQ(r.rank_model(rank).stats().bf16_fallbacks, 0) << rank;
    EXPECT_EQ(r.rank_model(rank).num_kv_pages(), kPages) << rank;
  }
}

// All ranks on one GPU, their collectives staged through the host. Not the one-shot all-reduce:
// under --dp the groups' work differs within a step, and the ranks that reach the one-shot
// all-reduce first spin there on SMs that the other ranks' kernels need, which stalled steps until
// the all-reduce's timeout on an H100 (--tp 4 --dp 2 with a group empty; --tp 2 --dp 2 with one
// group prefilling while the other decoded, in one run of two). Ranks on GPUs of their own cannot
// starve each other that way: CUDA graphs and the one-shot path under --dp are checked there
// (CudaDpAttentionNccl below).
void one_gpu_case(int tp, int dp) {
  DpHarness& h = harness();
  for (int r = 0; r < tp; ++r) {
    const Status fit = minimax_m3::check_real_shape_fit(
        minimax_m3::rank_config(h.cfg(), r, tp, 1, dp));
    ASSERT_TRUE(fit.is_ok()) << fit.to_string();
  }
  auto staged = h.runner(tp, dp, Comm::kHostStaged, /*graphs=*/false);
  ASSERT_TRUE(staged.is_ok()) << staged.status().to_string();
  check_layout(**staged, tp, dp);
  std::vector<RunnerCase> runners = {{"[host-staged]", staged->get(), {}, {}}};
  run_case(tp, dp, runners, {});
}

// --tp 2 --dp 2: two groups of one rank (each with all the heads; no attention all-reduce inside
// a group), the feed-forward blocks split over both.
TEST(CudaDpAttention, TwoGroupsOfOneRankOnOneGpuMatchTheCpuRanks) {
  ASSERT_GE(gpu_count(), 1) << "no GPU";
  one_gpu_case(2, 2);
}

// --tp 4 --dp 2: two groups of two ranks (16 query heads over one KV head each), the feed-forward
// blocks split over all four.
TEST(CudaDpAttention, TwoGroupsOfTwoRanksOnOneGpuMatchTheCpuRanks) {
  ASSERT_GE(gpu_count(), 1) << "no GPU";
  one_gpu_case(4, 2);
}

// A slice naming a group outside [0, --dp) fails the step on every rank before anything runs;
// the group stays usable.
TEST(CudaDpAttention, ASliceOfNoGroupIsRefused) {
  ASSERT_GE(gpu_count(), 1) << "no GPU";
  DpHarness& h = harness();
  auto r = h.runner(2, 2, Comm::kHostStaged, false);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  std::vector<int32_t> tokens = {5, 6, 7}, table = {0};
  ModelStep st;
  st.slices.resize(1);
  st.slices[0].tokens = tokens;
  st.slices[0].block_table = table;
  st.slices[0].logits_rows = {2};
  st.slices[0].dp_group = 2;
  ModelOutput out;
  const Status s = (*r)->forward(st, out);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("dp_group 2"), std::string::npos) << s.message();
  EXPECT_TRUE((*r)->health().is_ok());
  st.slices[0].dp_group = 1;
  out = {};
  const Status again = (*r)->forward(st, out);
  ASSERT_TRUE(again.is_ok()) << again.to_string();
  ASSERT_EQ(out.logits.size(), 1u);
  EXPECT_EQ(out.logits[0].size(), static_cast<size_t>(h.cfg().vocab_size));
}

// --tp 2 --dp 2 over two "nodes" (CudaRanks::nodes, what --nnodes 2 builds): two runners of one
// rank each in this process on one GPU, each node's GPU one attention group, their all-reduces
// staged through the host (NCCL refuses two ranks on one GPU). Node 0's runner sends every step
// over a Gloo step group before running it (each slice with its dp_group); node 1's follows on its
// own thread and runs attention on group 1's slices only. The one attention all-reduce over both
// ranks hands rank 0 group 1's rows, so no collective beyond --tp's: rank 0's outputs match the
// CPU ranks and equal the in-process runner's bit for bit on the decode steps (same kernels, same
// sums). Node 0's runner going away sends the stop, which ends node 1's follow() with ok.
TEST(CudaDpAttention, TwoNodesOnOneGpuFollowNodeZeroBitwise) {
  ASSERT_GE(gpu_count(), 1) << "no GPU";
  DpHarness& h = harness();
  constexpr int kTp = 2, kDp = 2;
  auto world = comm::create_local_gloo_group(kTp);
  ASSERT_TRUE(world.is_ok()) << world.status().to_string();
  auto steps = comm::create_local_gloo_group(2);
  ASSERT_TRUE(steps.is_ok()) << steps.status().to_string();
  auto hosts = std::make_shared<std::vector<std::unique_ptr<comm::Communicator>>>(
      std::move(world).value());
  const int64_t page_bytes =
      CudaM3Model::kv_bytes_per_page(h.cfg(), kTp, 1, KvCacheDtype::kBF16, kDp);
  std::vector<Result<std::unique_ptr<CudaM3ModelRunner>>> nodes;
  for (int k = 0; k < 2; ++k) nodes.emplace_back(internal_error("not loaded"));
  {
    // Both nodes load at once, as their processes would.
    std::vector<std::thread> loading;
    for (int k = 0; k < 2; ++k) {
      auto share = std::make_shared<CudaNodeShare>();
      share->first = k;
      share->count = 1;
      share->steps = std::shared_ptr<comm::Communicator>(std::move((*steps)[static_cast<size_t>(k)]));
      loading.emplace_back([&h, &nodes, hosts, share, page_bytes, k] {
        CudaM3Options o;
        o.max_batch = 16;
        o.use_graphs = false;
        CudaRanks ranks;
        ranks.ranks = kTp;
        ranks.dp = kDp;
        ranks.devices = {0};
        ranks.timeout = std::chrono::seconds(60);
        ranks.nodes = share;
        ranks.make_communicator = [hosts](int r, int device, CUstream_st* stream)
            -> Result<std::unique_ptr<comm::Communicator>> {
          return std::unique_ptr<comm::Communicator>(std::make_unique<testing::HostStagedCommunicator>(
              std::move((*hosts)[static_cast<size_t>(r)]), device, stream));
        };
        nodes[static_cast<size_t>(k)] = CudaM3ModelRunner::create(
            h.cfg(), h.src(), kPages * page_bytes, o, std::move(ranks));
      });
    }
    for (std::thread& t : loading) t.join();
  }
  for (auto& n : nodes) ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  CudaM3ModelRunner& node0 = **nodes[0];
  CudaM3ModelRunner& node1 = **nodes[1];
  for (CudaM3ModelRunner* n : {&node0, &node1}) {
    EXPECT_EQ(n->num_ranks(), kTp);
    EXPECT_EQ(n->dp_groups(), kDp);
    EXPECT_EQ(n->num_kv_pages(), kPages);
    EXPECT_EQ(n->local_ranks(), 1);
    // A group of one GPU holds all of the attention heads and 1/T of the feed-forward blocks.
    const MiniMaxM3Config& rc = n->rank_model(0).config();
    EXPECT_EQ(rc.num_attention_heads, h.cfg().num_attention_heads);
    EXPECT_EQ(rc.num_key_value_heads, h.cfg().num_key_value_heads);
    EXPECT_EQ(rc.intermediate_size, h.cfg().intermediate_size / kTp);
    EXPECT_EQ(n->rank_model(0).stats().bf16_fallbacks, 0);
  }
  EXPECT_EQ(node0.first_rank(), 0);
  EXPECT_EQ(node1.first_rank(), 1);
  EXPECT_NE(node0.all_reduce_path().find("the caller's communicator"), std::string::npos);
  {
    ModelOutput none;
    EXPECT_EQ(node1.forward(ModelStep{}, none).code(), StatusCode::kInternal)
        << "only node 0 runs the engine's steps";
    EXPECT_EQ(node0.follow().code(), StatusCode::kInternal) << "node 0 follows no one";
  }
  Status followed = internal_error("not run");
  std::thread follower([&] { followed = node1.follow(); });
  auto in_process = h.runner(kTp, kDp, Comm::kHostStaged, /*graphs=*/false);
  if (in_process.is_ok()) {
    std::vector<RunnerCase> runners = {{"[host-staged, one process]", in_process->get(), {}, {}},
                                       {"[host-staged, two nodes]", &node0, {}, {}}};
    run_case(kTp, kDp, runners, {{0, 1}});
  } else {
    ADD_FAILURE() << in_process.status().to_string();
  }
  nodes[0] = internal_error("node 0 stopped");  // its runner sends the stop
  follower.join();
  EXPECT_TRUE(followed.is_ok()) << followed.to_string();
}

TEST(CudaDpAttentionNccl, TwoGpusWithGraphsMatchEagerBitwise) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs (tools/device/run-all.sh runs it there)";
  DpHarness& h = harness();
  auto graphs = h.runner(2, 2, Comm::kNccl, /*graphs=*/true);
  ASSERT_TRUE(graphs.is_ok()) << graphs.status().to_string();
  auto eager = h.runner(2, 2, Comm::kNccl, /*graphs=*/false);
  ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();
  check_layout(**graphs, 2, 2);
  std::printf("[cuda_dp_attention] all-reduce: %s\n", (*graphs)->all_reduce_path().c_str());
  std::vector<RunnerCase> runners = {{"[nccl graphs]", graphs->get(), {}, {}},
                                     {"[nccl eager]", eager->get(), {}, {}}};
  run_case(2, 2, runners, {{0, 1}});
  EXPECT_GE((*graphs)->rank_model(0).stats().graph_replays, 1);
}

}  // namespace
}  // namespace m3
