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
//
// Tolerance: the unsharded GPU model's bound against the CPU (rel_bound: bf16 roundings of the
// activations). Sharding changes the float32 order of the o_proj / down / MoE combine sums (two
// partial sums added once, ~2^-24 relative), which moves a bf16 rounding of a downstream activation
// by at most one ulp where it lands on a rounding boundary: one of the roundings the bound already
// counts. The rank-0 logits must be within the bound of the CPU's and agree on the argmax wherever
// the CPU's margin exceeds twice it; the sharded and unsharded GPU greedy tokens must agree where
// the margin allows too (they are compared through the CPU).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/comm/gloo_communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "host_staged_communicator.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"
#include "model/minimax_m3/cuda/cuda_m3_runner.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
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

  // --tp 2 on GPU 0 through the host (graphs off), or on GPUs 0 and 1 over NCCL.
  Result<std::unique_ptr<CudaM3ModelRunner>> runner(bool nccl, bool graphs) {
    CudaM3Options o;
    o.max_batch = 16;
    o.use_graphs = graphs;
    CudaRanks ranks;
    ranks.ranks = 2;
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
    const int64_t page_bytes = CudaM3Model::kv_bytes_per_page(cfg_, 2);
    return CudaM3ModelRunner::create(cfg_, src_, kPages * page_bytes, o, std::move(ranks));
  }

  const MiniMaxM3Config& cfg() const { return cfg_; }
  double rel_bound() const { return real_model_fixture::rel_bound(cfg_); }
  bool ready() const { return cpu_model_ != nullptr && whole_ != nullptr; }

  Seq new_seq(int64_t max_tokens) { return pages_.new_seq(max_tokens); }
  void reset_pages() { pages_.reset(); }

  // One step on the CPU, the unsharded GPU model and each runner (outputs: [0] unsharded, then
  // the runners').
  void step(std::vector<Seq*> seqs, const std::vector<std::vector<int32_t>>& tokens, bool all_rows,
            std::vector<CudaM3ModelRunner*> runners, ForwardOutput* cpu_out,
            std::vector<ModelOutput>* gpu_out) {
    ModelStep st;
    st.slices = real_model_fixture::step_inputs(seqs, tokens, all_rows);
    Status s = cpu_model_->forward(st.slices, cpu_cache_.get(), cpu_out);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
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
  real_model_fixture::PageIds pages_;
};

TpHarness& harness() {
  static TpHarness h;
  return h;
}

// Every output of `outs` against the CPU's, slice by slice.
void compare_all(const ForwardOutput& cpu, const std::vector<ModelOutput>& outs, int64_t v,
                 double bound, const std::string& what, std::vector<Compare>* cmps) {
  cmps->assign(outs.size(), Compare{bound});
  for (size_t g = 0; g < outs.size(); ++g)
    for (size_t i = 0; i < cpu.logits.size(); ++i) {
      ASSERT_EQ(outs[g].logits[i].size(), cpu.logits[i].size()) << what << " output " << g;
      (*cmps)[g].rows_of(outs[g].logits[i].data(), cpu.logits[i].data(),
                         static_cast<int64_t>(cpu.logits[i].size()) / v, v);
    }
  for (size_t g = 0; g < outs.size(); ++g)
    (*cmps)[g].report(what + (g == 0 ? " (unsharded)" : " (--tp 2)"));
}

// Prefill (600 tokens, all rows), a step of three prefill chunks, a prefill chunk with decode rows
// of two other sequences, then 16 greedy decode steps at batch 3 (teacher-forced by the CPU).
void run_case(std::vector<CudaM3ModelRunner*> runners, const std::string& name) {
  TpHarness& h = harness();
  h.reset_pages();
  const int64_t v = h.cfg().vocab_size;
  ForwardOutput cpu;
  std::vector<ModelOutput> gpu;
  std::vector<Compare> cmps;
  Seq a = h.new_seq(600), b = h.new_seq(300), c = h.new_seq(300), d = h.new_seq(700);
  ASSERT_NO_FATAL_FAILURE(h.step({&d}, {random_tokens(600, v, 41)}, true, runners, &cpu, &gpu));
  ASSERT_NO_FATAL_FAILURE(compare_all(cpu, gpu, v, h.rel_bound(), name + " prefill 600", &cmps));
  for (const Compare& x : cmps) EXPECT_TRUE(x.ok());
  ASSERT_NO_FATAL_FAILURE(h.step(
      {&a, &b, &c}, {random_tokens(300, v, 42), random_tokens(250, v, 43), random_tokens(150, v, 44)},
      true, runners, &cpu, &gpu));
  ASSERT_NO_FATAL_FAILURE(compare_all(cpu, gpu, v, h.rel_bound(), name + " three chunks", &cmps));
  for (const Compare& x : cmps) EXPECT_TRUE(x.ok());
  std::vector<std::vector<int32_t>> toks = {{last_argmax(cpu.logits[1], v)},
                                            random_tokens(220, v, 45),
                                            {last_argmax(cpu.logits[2], v)}};
  ASSERT_NO_FATAL_FAILURE(h.step({&b, &a, &c}, toks, true, runners, &cpu, &gpu));
  ASSERT_NO_FATAL_FAILURE(
      compare_all(cpu, gpu, v, h.rel_bound(), name + " chunk + 2 decode rows", &cmps));
  for (const Compare& x : cmps) EXPECT_TRUE(x.ok());
  std::vector<Compare> dec(1 + runners.size(), Compare{h.rel_bound()});
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
      }
    // Two runners: graph replays against eager launches, bitwise.
    if (gpu.size() == 3)
      for (size_t i = 0; i < 3; ++i)
        if (std::memcmp(gpu[1].logits[i].data(), gpu[2].logits[i].data(), v * sizeof(float)) != 0)
          ++bitwise_bad;
  }
  for (size_t g = 0; g < dec.size(); ++g) {
    dec[g].report(name + " decode batch 3, 16 steps" + (g == 0 ? " (unsharded)" : " (--tp 2)"));
    EXPECT_TRUE(dec[g].ok());
  }
  if (gpu.size() == 3) {
    std::printf("[cuda_tensor_parallel] %s graphs vs eager: %lld of 48 rows differ bitwise\n",
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
  std::printf("[cuda_tensor_parallel] rank weights %.1f MB + %.1f MB (KV %.1f MB each)\n",
              s0.weight_bytes / 1e6, s1.weight_bytes / 1e6, s0.kv_bytes / 1e6);
  run_case({r->get()}, "[host-staged]");
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

}  // namespace
}  // namespace m3
