// Tensor parallelism of the real-shape CUDA model (CudaM3ModelRunner, --tp 2): each rank holds
// its heads and intermediate slices (windows of the checkpoint's stored MXFP8 / NVFP4 bytes) and
// all-reduces the attention output and the feed-forward block. Checked against the float32 CPU
// model and the unsharded GPU model on the same weights (real_model_fixture.h; the weight shaping
// and error model are explained in cuda_real_model_test.cpp).
//
//  * One GPU (always): both ranks on GPU 0, their all-reduces staged through the host over an
//    in-process Gloo group (host_staged_communicator.h; NCCL refuses two ranks on one device),
//    launches eager.
//  * Two GPUs (CudaTensorParallelNccl, needs 2): NCCL on the compute streams, CUDA graphs on;
//    the graph replays must be bitwise equal to a second runner's eager launches.
//  * Expert parallelism (--ep 2, which is --tp 2 --ep 2: SGLang's meaning, the expert-parallel
//    ranks among the tensor-parallel ones): rank r holds the whole experts [4r, 4r + 4) of the 8,
//    routes every token over all 8 and runs only its own (the other rank's slots skipped on the
//    device); the all-reduce after the combine adds them. Checked, as above, against the CPU and
//    the unsharded GPU model, and also against the CPU ranks under the same --tp 2 --ep 2
//    (TensorParallelCpuRunner: the all-to-all dispatch, the semantics' reference), on one GPU
//    through the host and over NCCL with graphs on two.
//
// Tolerance: the unsharded GPU model's bound against the CPU (rel_bound: bf16 roundings of the
// activations). Sharding changes the float32 order of the o_proj / down / MoE combine sums (two
// partial sums added once, ~2^-24 relative), which moves a bf16 rounding of a downstream activation
// by at most one ulp where it lands on a rounding boundary: one of the roundings the bound already
// counts. Under --ep a token's routed sum is each rank's sum of its own slots (in ascending slot
// order) added across the ranks: again one reordering of float32 sums of the same products. The
// CPU ranks equal the CPU model within 2.3e-5 relative (docs/parallel.md), far inside the bound,
// so the same bound holds against them. The rank-0 logits must be within the bound of the CPU's and agree on the argmax wherever
// the CPU's margin exceeds twice it; the sharded and unsharded GPU greedy tokens must agree where
// the margin allows too (they are compared through the CPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "backend/comm/gloo_communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "host_staged_communicator.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"
#include "model/minimax_m3/cuda/gpu_weights.h"
#include "model/minimax_m3/cuda/cuda_m3_runner.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "model/minimax_m3/tensor_parallel_runner.h"
#include "real_model_fixture.h"

namespace m3 {
namespace {

using minimax_m3::CudaM3Model;
using minimax_m3::CudaM3Options;
using minimax_m3::ForwardOutput;
using minimax_m3::Model;
using minimax_m3::PagedKvCache;
using minimax_m3::SequenceInput;
using real_model_fixture::Compare;
using real_model_fixture::Seq;
using real_model_fixture::last_argmax;
using real_model_fixture::random_tokens;
using real_model_fixture::test_config;
using real_model_fixture::TestSource;

constexpr int64_t kPages = 48;

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// The CPU model, the unsharded GPU model and --tp 2 runners on the same weights and page ids.
class TpHarness {
 public:
  TpHarness() : cfg_(test_config()), src_(cfg_), cpu_(0), pages_(kPages, 7) {
    auto m = Model::load(cfg_, src_, &cpu_);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (m.is_ok()) cpu_model_ = std::move(m).value();
    cpu_cache_ = std::make_unique<PagedKvCache>(&cpu_, cfg_, kPages);
    CudaM3Options o;
    o.num_kv_pages = kPages;
    o.max_batch = 16;
    o.use_graphs = false;
    auto g = CudaM3Model::load(cfg_, src_, o);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    if (g.is_ok()) whole_ = std::move(g).value();
  }

  // --tp 2 (--ep ep) on GPU 0 through the host (graphs off), or on GPUs 0 and 1 over NCCL.
  Result<std::unique_ptr<CudaM3ModelRunner>> runner(bool nccl, bool graphs, int ep = 1) {
    CudaM3Options o;
    o.max_batch = 16;
    o.use_graphs = graphs;
    CudaRanks ranks;
    ranks.ranks = 2;
    ranks.ep = ep;
    if (!nccl) {
      ranks.devices = {0, 0};
      M3_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<comm::Communicator>> hosts,
                          comm::create_local_gloo_group(2));
      auto shared = std::make_shared<std::vector<std::unique_ptr<comm::Communicator>>>(
          std::move(hosts));
      ranks.make_communicator = [shared](int r, int device, CUstream_st* stream)
          -> Result<std::unique_ptr<comm::Communicator>> {
        return std::unique_ptr<comm::Communicator>(std::make_unique<testing::HostStagedCommunicator>(
            std::move((*shared)[static_cast<size_t>(r)]), device, stream));
      };
    }
    const int64_t page_bytes = CudaM3Model::kv_bytes_per_page(cfg_, 2, ep);
    return CudaM3ModelRunner::create(cfg_, src_, kPages * page_bytes, o, std::move(ranks));
  }

  const MiniMaxM3Config& cfg() const { return cfg_; }
  const TestSource& src() const { return src_; }
  double rel_bound() const { return real_model_fixture::rel_bound(cfg_); }
  bool ready() const { return cpu_model_ != nullptr && whole_ != nullptr; }

  Seq new_seq(int64_t max_tokens) { return pages_.new_seq(max_tokens); }
  void reset_pages() { pages_.reset(); }

  // CPU ranks (--tp 2 --ep ep) stepped beside the CPU model from the next step on (fresh KV, so
  // call it before a case's first step); ep 0: none.
  Status use_cpu_ranks(int ep) {
    cpu_ranks_.reset();
    if (ep == 0) return Status::ok();
    M3_ASSIGN_OR_RETURN(cpu_ranks_, TensorParallelCpuRunner::create(
                                        cfg_, src_, 2, ep, 4, static_cast<int32_t>(kPages)));
    return Status::ok();
  }
  bool has_cpu_ranks() const { return cpu_ranks_ != nullptr; }
  const ModelOutput& cpu_ranks_out() const { return cpu_ranks_out_; }

  // One step on the CPU, the unsharded GPU model and each runner (outputs: [0] unsharded, then
  // the runners').
  void step(std::vector<Seq*> seqs, const std::vector<std::vector<int32_t>>& tokens, bool all_rows,
            std::vector<CudaM3ModelRunner*> runners, ForwardOutput* cpu_out,
            std::vector<ModelOutput>* gpu_out) {
    ModelStep st;
    st.slices = real_model_fixture::step_inputs(seqs, tokens, all_rows);
    Status s = cpu_model_->forward(st.slices, cpu_cache_.get(), cpu_out);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    if (cpu_ranks_) {
      cpu_ranks_out_ = {};
      s = cpu_ranks_->forward(st, cpu_ranks_out_);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    }
    gpu_out->assign(1 + runners.size(), {});
    ForwardOutput whole_out;
    s = whole_->forward(st.slices, &whole_out);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    (*gpu_out)[0].logits = std::move(whole_out.logits);
    for (size_t g = 0; g < runners.size(); ++g) {
      s = runners[g]->forward(st, (*gpu_out)[g + 1]);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    }
    for (size_t i = 0; i < seqs.size(); ++i)
      seqs[i]->cached += static_cast<int64_t>(tokens[i].size());
  }

 private:
  MiniMaxM3Config cfg_;
  TestSource src_;
  CpuBackend cpu_;
  std::unique_ptr<Model> cpu_model_;
  std::unique_ptr<PagedKvCache> cpu_cache_;
  std::unique_ptr<CudaM3Model> whole_;
  std::unique_ptr<TensorParallelCpuRunner> cpu_ranks_;
  ModelOutput cpu_ranks_out_;
  real_model_fixture::PageIds pages_;
};

TpHarness& harness() {
  static TpHarness h;
  return h;
}

// Every output of `outs` against the CPU's, slice by slice.
void compare_all(const ForwardOutput& cpu, const std::vector<ModelOutput>& outs, int64_t v,
                 double bound, const std::string& what, std::vector<Compare>* cmps,
                 const std::string& sharded = " (--tp 2)") {
  cmps->assign(outs.size(), Compare{bound});
  for (size_t g = 0; g < outs.size(); ++g)
    for (size_t i = 0; i < cpu.logits.size(); ++i) {
      ASSERT_EQ(outs[g].logits[i].size(), cpu.logits[i].size()) << what << " output " << g;
      (*cmps)[g].rows_of(outs[g].logits[i].data(), cpu.logits[i].data(),
                         static_cast<int64_t>(cpu.logits[i].size()) / v, v);
    }
  for (size_t g = 0; g < outs.size(); ++g)
    (*cmps)[g].report(what + (g == 0 ? " (unsharded)" : sharded));
}

// The sharded GPU outputs (outs[1..]) against the CPU ranks' (same layout), slice by slice.
void compare_with_cpu_ranks(const ModelOutput& ranks, const std::vector<ModelOutput>& outs,
                            int64_t v, double bound, const std::string& what,
                            std::vector<Compare>* cmps) {
  cmps->assign(outs.size() - 1, Compare{bound});
  for (size_t g = 1; g < outs.size(); ++g)
    for (size_t i = 0; i < ranks.logits.size(); ++i) {
      ASSERT_EQ(outs[g].logits[i].size(), ranks.logits[i].size()) << what << " output " << g;
      (*cmps)[g - 1].rows_of(outs[g].logits[i].data(), ranks.logits[i].data(),
                             static_cast<int64_t>(ranks.logits[i].size()) / v, v);
    }
  for (const Compare& c : *cmps) c.report(what + " vs CPU ranks");
}

// Prefill (600 tokens, all rows), a step of three prefill chunks, a prefill chunk with decode rows
// of two other sequences, then 16 greedy decode steps at batch 3 (teacher-forced by the CPU).
// With CPU ranks in the harness (use_cpu_ranks) every step's sharded outputs are also checked
// against theirs.
void run_case(std::vector<CudaM3ModelRunner*> runners, const std::string& name,
              const std::string& sharded = " (--tp 2)") {
  TpHarness& h = harness();
  h.reset_pages();
  const int64_t v = h.cfg().vocab_size;
  ForwardOutput cpu;
  std::vector<ModelOutput> gpu;
  std::vector<Compare> cmps, vs_ranks;
  const auto check = [&](const std::string& what) {
    ASSERT_NO_FATAL_FAILURE(compare_all(cpu, gpu, v, h.rel_bound(), name + what, &cmps, sharded));
    for (const Compare& x : cmps) EXPECT_TRUE(x.ok()) << what;
    if (!h.has_cpu_ranks()) return;
    ASSERT_NO_FATAL_FAILURE(compare_with_cpu_ranks(h.cpu_ranks_out(), gpu, v, h.rel_bound(),
                                                   name + what + sharded, &vs_ranks));
    for (const Compare& x : vs_ranks) EXPECT_TRUE(x.ok()) << what << " vs CPU ranks";
  };
  Seq a = h.new_seq(600), b = h.new_seq(300), c = h.new_seq(300), d = h.new_seq(700);
  ASSERT_NO_FATAL_FAILURE(h.step({&d}, {random_tokens(600, v, 41)}, true, runners, &cpu, &gpu));
  ASSERT_NO_FATAL_FAILURE(check(" prefill 600"));
  ASSERT_NO_FATAL_FAILURE(h.step(
      {&a, &b, &c}, {random_tokens(300, v, 42), random_tokens(250, v, 43), random_tokens(150, v, 44)},
      true, runners, &cpu, &gpu));
  ASSERT_NO_FATAL_FAILURE(check(" three chunks"));
  std::vector<std::vector<int32_t>> toks = {{last_argmax(cpu.logits[1], v)},
                                            random_tokens(220, v, 45),
                                            {last_argmax(cpu.logits[2], v)}};
  ASSERT_NO_FATAL_FAILURE(h.step({&b, &a, &c}, toks, true, runners, &cpu, &gpu));
  ASSERT_NO_FATAL_FAILURE(check(" chunk + 2 decode rows"));
  std::vector<Compare> dec(1 + runners.size(), Compare{h.rel_bound()});
  std::vector<Compare> dec_ranks(runners.size(), Compare{h.rel_bound()});
  std::vector<Seq*> batch = {&a, &b, &c};
  // The mixed step's slices were (b, a, c); the decode steps' are (a, b, c).
  std::vector<size_t> from = {1, 0, 2};
  std::vector<std::vector<int32_t>> next(3);
  int64_t bitwise_bad = 0;
  for (int step = 0; step < 16; ++step) {
    for (size_t i = 0; i < 3; ++i) next[i] = {last_argmax(cpu.logits[from[i]], v)};
    from = {0, 1, 2};
    ASSERT_NO_FATAL_FAILURE(h.step(batch, next, false, runners, &cpu, &gpu));
    for (size_t g = 0; g < gpu.size(); ++g)
      for (size_t i = 0; i < 3; ++i) {
        ASSERT_EQ(gpu[g].logits[i].size(), static_cast<size_t>(v));
        dec[g].rows_of(gpu[g].logits[i].data(), cpu.logits[i].data(), 1, v);
        if (g > 0 && h.has_cpu_ranks()) {
          ASSERT_EQ(h.cpu_ranks_out().logits[i].size(), static_cast<size_t>(v));
          dec_ranks[g - 1].rows_of(gpu[g].logits[i].data(), h.cpu_ranks_out().logits[i].data(),
                                   1, v);
        }
      }
    // Two runners (graph replays and eager launches, or ranks in one process and over two
    // "nodes"): bitwise.
    if (gpu.size() == 3)
      for (size_t i = 0; i < 3; ++i)
        if (std::memcmp(gpu[1].logits[i].data(), gpu[2].logits[i].data(), v * sizeof(float)) != 0)
          ++bitwise_bad;
  }
  for (size_t g = 0; g < dec.size(); ++g) {
    dec[g].report(name + " decode batch 3, 16 steps" + (g == 0 ? " (unsharded)" : sharded));
    EXPECT_TRUE(dec[g].ok());
  }
  if (h.has_cpu_ranks())
    for (const Compare& x : dec_ranks) {
      x.report(name + " decode batch 3, 16 steps" + sharded + " vs CPU ranks");
      EXPECT_TRUE(x.ok());
    }
  if (gpu.size() == 3) {
    std::printf("[cuda_tensor_parallel] %s second runner vs first: %lld of 48 rows differ "
                "bitwise\n",
                name.c_str(), static_cast<long long>(bitwise_bad));
    EXPECT_EQ(bitwise_bad, 0);
  }
}

TEST(CudaTensorParallel, TwoRanksOnOneGpuMatchTheCpuAndTheUnshardedModel) {
  ASSERT_GE(gpu_count(), 1) << "no GPU";
  TpHarness& h = harness();
  ASSERT_TRUE(h.ready());
  auto r = h.runner(/*nccl=*/false, /*graphs=*/false);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)->num_ranks(), 2);
  EXPECT_EQ((*r)->num_kv_pages(), kPages);
  // Rank r holds half the query heads and half of every intermediate dimension, all quantised.
  const minimax_m3::CudaM3Stats s0 = (*r)->rank_model(0).stats(), s1 = (*r)->rank_model(1).stats();
  EXPECT_EQ(s0.bf16_fallbacks, 0);
  EXPECT_EQ(s1.quantised_matrices, s0.quantised_matrices);
  EXPECT_EQ((*r)->rank_model(1).config().num_attention_heads, h.cfg().num_attention_heads / 2);
  EXPECT_EQ((*r)->rank_model(1).config().intermediate_size, h.cfg().intermediate_size / 2);
  // And its vocabulary slice of the embedding and head (vocab_slice), read from the checkpoint.
  for (int rank = 0; rank < 2; ++rank) {
    const minimax_m3::VocabSlice want = minimax_m3::vocab_slice(h.cfg().vocab_size, rank, 2);
    const minimax_m3::DevWeights& w = (*r)->rank_model(rank).dev_weights();
    EXPECT_EQ(w.vocab_first, want.begin) << "rank " << rank;
    EXPECT_EQ(w.vocab_rows, want.count) << "rank " << rank;
    EXPECT_EQ(w.lm_head.n, want.count) << "rank " << rank;
  }
  std::printf("[cuda_tensor_parallel] rank weights %.1f MB + %.1f MB (KV %.1f MB each)\n",
              s0.weight_bytes / 1e6, s1.weight_bytes / 1e6, s0.kv_bytes / 1e6);
  run_case({r->get()}, "[host-staged]");
}

// --tp 2 over two "nodes" (CudaRanks::nodes, what --nnodes 2 builds): here two runners of one
// rank each in this process on one GPU, their all-reduces staged through the host (NCCL refuses
// two ranks on one GPU). Node 0's runner sends every step over a Gloo step group before running
// it; node 1's follows on its own thread. Rank 0's outputs match the CPU and the unsharded model
// as the in-process runner's do, and equal them bitwise (same kernels, same sums); node 0's
// runner going away sends the stop, which ends node 1's follow() with ok.
TEST(CudaTensorParallel, TwoNodesOnOneGpuFollowNodeZeroBitwise) {
  ASSERT_GE(gpu_count(), 1) << "no GPU";
  TpHarness& h = harness();
  ASSERT_TRUE(h.ready());
  auto world = comm::create_local_gloo_group(2);
  ASSERT_TRUE(world.is_ok()) << world.status().to_string();
  auto steps = comm::create_local_gloo_group(2);
  ASSERT_TRUE(steps.is_ok()) << steps.status().to_string();
  auto hosts = std::make_shared<std::vector<std::unique_ptr<comm::Communicator>>>(
      std::move(world).value());
  std::vector<Result<std::unique_ptr<CudaM3ModelRunner>>> nodes;
  for (int k = 0; k < 2; ++k) nodes.emplace_back(internal_error("not loaded"));
  {
    std::vector<std::thread> loading;
    for (int k = 0; k < 2; ++k) {
      auto share = std::make_shared<CudaNodeShare>();
      share->first = k;
      share->count = 1;
      share->steps = std::shared_ptr<comm::Communicator>(std::move((*steps)[static_cast<size_t>(k)]));
      loading.emplace_back([&h, &nodes, hosts, share, k] {
        CudaM3Options o;
        o.max_batch = 16;
        o.use_graphs = false;
        CudaRanks ranks;
        ranks.ranks = 2;
        ranks.devices = {0};
        ranks.nodes = share;
        ranks.make_communicator = [hosts](int r, int device, CUstream_st* stream)
            -> Result<std::unique_ptr<comm::Communicator>> {
          return std::unique_ptr<comm::Communicator>(std::make_unique<testing::HostStagedCommunicator>(
              std::move((*hosts)[static_cast<size_t>(r)]), device, stream));
        };
        nodes[static_cast<size_t>(k)] = CudaM3ModelRunner::create(
            h.cfg(), h.src(), kPages * CudaM3Model::kv_bytes_per_page(h.cfg(), 2, 1), o,
            std::move(ranks));
      });
    }
    for (std::thread& t : loading) t.join();
  }
  for (auto& n : nodes) ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  CudaM3ModelRunner& node0 = **nodes[0];
  CudaM3ModelRunner& node1 = **nodes[1];
  EXPECT_EQ(node0.num_ranks(), 2);
  EXPECT_EQ(node1.num_ranks(), 2);
  EXPECT_EQ(node0.first_rank(), 0);
  EXPECT_EQ(node1.first_rank(), 1);
  EXPECT_EQ(node1.local_ranks(), 1);
  EXPECT_EQ(node1.rank_model(0).config().num_attention_heads, h.cfg().num_attention_heads / 2);
  EXPECT_NE(node0.all_reduce_path().find("the caller's communicator"), std::string::npos);
  {
    ModelOutput none;
    EXPECT_EQ(node1.forward(ModelStep{}, none).code(), StatusCode::kInternal)
        << "only node 0 runs the engine's steps";
    EXPECT_EQ(node0.follow().code(), StatusCode::kInternal) << "node 0 follows no one";
  }
  Status followed = internal_error("not run");
  std::thread follower([&] { followed = node1.follow(); });
  auto in_process = h.runner(/*nccl=*/false, /*graphs=*/false);
  if (in_process.is_ok()) {
    run_case({in_process->get(), &node0}, "[host-staged, one process vs two nodes]");
  } else {
    ADD_FAILURE() << in_process.status().to_string();
  }
  nodes[0] = internal_error("node 0 stopped");  // its runner sends the stop
  follower.join();
  EXPECT_TRUE(followed.is_ok()) << followed.to_string();
}

TEST(CudaTensorParallelNccl, TwoGpusWithGraphsMatchEagerBitwise) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs (tools/device/run-all.sh runs it there)";
  TpHarness& h = harness();
  ASSERT_TRUE(h.ready());
  auto graphs = h.runner(/*nccl=*/true, /*graphs=*/true);
  ASSERT_TRUE(graphs.is_ok()) << graphs.status().to_string();
  auto eager = h.runner(/*nccl=*/true, /*graphs=*/false);
  ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();
  run_case({graphs->get(), eager->get()}, "[nccl]");
  EXPECT_GE((*graphs)->rank_model(0).stats().graph_replays, 1);
  EXPECT_GE((*graphs)->rank_model(1).stats().graph_replays, 1);
}

// --ep 2 (= --tp 2 --ep 2): each rank holds 4 whole experts at the full intermediate width (not
// 8 half-width ones as under --tp 2), in their stored NVFP4; its logits match the CPU, the
// unsharded GPU model and the CPU ranks under the same layout.
TEST(CudaExpertParallel, TwoRanksOnOneGpuMatchTheCpuRanksAndTheUnshardedModel) {
  ASSERT_GE(gpu_count(), 1) << "no GPU";
  TpHarness& h = harness();
  ASSERT_TRUE(h.ready());
  auto r = h.runner(/*nccl=*/false, /*graphs=*/false, /*ep=*/2);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)->num_ranks(), 2);
  for (int rank = 0; rank < 2; ++rank) {
    const MiniMaxM3Config& rc = (*r)->rank_model(rank).config();
    EXPECT_EQ(rc.intermediate_size, h.cfg().intermediate_size) << "whole experts";
    EXPECT_EQ(rc.num_local_experts, h.cfg().num_local_experts) << "the router scores all";
    EXPECT_EQ(rc.num_attention_heads, h.cfg().num_attention_heads / 2) << "attention as --tp 2";
    EXPECT_EQ((*r)->rank_model(rank).stats().bf16_fallbacks, 0);
  }
  // Same routed payload as --tp 2 (half the experts at twice the width), so the ranks hold
  // about what --tp 2's do; fewer NVFP4 multipliers.
  auto tp = h.runner(/*nccl=*/false, /*graphs=*/false, /*ep=*/1);
  ASSERT_TRUE(tp.is_ok()) << tp.status().to_string();
  const int64_t ep_bytes = (*r)->rank_model(0).stats().weight_bytes;
  const int64_t tp_bytes = (*tp)->rank_model(0).stats().weight_bytes;
  std::printf("[cuda_tensor_parallel] rank 0 weights: --ep 2 %.3f MB, --tp 2 %.3f MB\n",
              ep_bytes / 1e6, tp_bytes / 1e6);
  EXPECT_NEAR(static_cast<double>(ep_bytes), static_cast<double>(tp_bytes), 0.02 * tp_bytes);
  tp->reset();
  ASSERT_TRUE(h.use_cpu_ranks(2).is_ok());
  run_case({r->get()}, "[host-staged]", " (--ep 2)");
  ASSERT_TRUE(h.use_cpu_ranks(0).is_ok());
}

TEST(CudaExpertParallelNccl, TwoGpusWithGraphsMatchEagerBitwise) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs (tools/device/run-all.sh runs it there)";
  TpHarness& h = harness();
  ASSERT_TRUE(h.ready());
  auto graphs = h.runner(/*nccl=*/true, /*graphs=*/true, /*ep=*/2);
  ASSERT_TRUE(graphs.is_ok()) << graphs.status().to_string();
  auto eager = h.runner(/*nccl=*/true, /*graphs=*/false, /*ep=*/2);
  ASSERT_TRUE(eager.is_ok()) << eager.status().to_string();
  ASSERT_TRUE(h.use_cpu_ranks(2).is_ok());
  run_case({graphs->get(), eager->get()}, "[nccl]", " (--ep 2)");
  ASSERT_TRUE(h.use_cpu_ranks(0).is_ok());
  EXPECT_GE((*graphs)->rank_model(0).stats().graph_replays, 1);
  EXPECT_GE((*graphs)->rank_model(1).stats().graph_replays, 1);
}

}  // namespace
}  // namespace m3
