// Tensor and expert parallelism of the float32 model on CPU ranks (model/minimax_m3/
// tensor_parallel.h, expert_parallel_moe.h): the bundled model (8 query heads, 2 KV heads, 8
// routed experts) split over 2 ranks (one KV head each), 4 ranks (each KV head on two ranks), with
// the experts placed whole over 2 and 4 ranks (--ep 2 = --tp 2 --ep 2, --ep 4), and over 2 of 4
// ranks with each expert halved by its intermediate dimension (--tp 4 --ep 2), against the
// unsharded model, for a prefill long enough that MSA block selection is active and then greedy
// decode steps. Every rank runs on its own thread with its own CPU backend, KV cache and Gloo
// communicator.
//
// Tolerance: sharding changes only the order of float32 sums: each rank sums its heads' (or
// intermediate columns') products, and the all-reduce adds the T partial sums. Under expert
// parallelism a token's routed experts are computed whole on their owner and weighted and summed
// in the unsharded slot order on the token's rank, so only the all-reduce (routed sum, shared
// expert's partial sums) reorders; with --tp 4 --ep 2 each expert's down projection is also summed
// in two halves. A reordered sum of K float32 terms differs by at most ~K·2^-24 of the sum of
// their magnitudes (Higham, ch. 3); in the bundled model that is ~1e-5 of the logits' scale per
// layer and the six layers keep it below 1e-4 in practice. The bound, 2e-3 absolute on logits of magnitude
// ~10, leaves a 20x margin and is 15x below the smallest top-1/top-2 margin the golden fixtures
// record (0.03), so the argmax and the greedy tokens must be equal.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "sharded_ranks.h"

#include "backend/comm/gloo_communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "loader/checkpoint.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "model/minimax_m3/tensor_parallel.h"

namespace m3::minimax_m3 {
namespace {

const std::string kModel = std::string(M3_REPO_ROOT) + "/models/m3-tiny";
constexpr float kTolerance = 2e-3f;

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

using testing::Layout;

class TensorParallelCpu : public ::testing::TestWithParam<Layout> {};

TEST_P(TensorParallelCpu, ShardedEqualsUnsharded) {
  const Layout layout = GetParam();
  const int tp = layout.tp;
  auto cfg = load_minimax_m3_config(kModel);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto ckpt = Checkpoint::open(kModel);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const int64_t vocab = cfg->vocab_size, page = cfg->index_block_size;
  // A prompt longer than the indexer's top-k blocks (so blocks are selected), then decode steps.
  const int64_t prompt_len = (cfg->index_topk_blocks + 2) * page + 5;
  const int64_t pages = (prompt_len + 16) / page + 1;

  // The unsharded reference.
  CpuBackend ref_backend(2);
  auto ref = Model::load(*cfg, **ckpt, &ref_backend);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  PagedKvCache ref_cache(&ref_backend, (*ref)->config(), pages);

  // The ranks.
  testing::ShardedModel ranks;
  const Status loaded = ranks.load(*cfg, **ckpt, layout, pages);
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  for (const auto& m : ranks.models)
    EXPECT_EQ(m->config().num_attention_heads, cfg->num_attention_heads / tp);

  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  std::vector<int32_t> table;
  for (int32_t p = 0; p < pages; ++p) table.push_back(p);
  ModelSlice s;
  s.tokens = prompt;
  s.start_pos = 0;
  s.block_table = table;
  for (int32_t i = 0; i < prompt_len; ++i) s.logits_rows.push_back(i);

  float worst = 0;
  int64_t pos = 0;
  std::vector<int32_t> next_token(1);
  int32_t ref_next = 0, tp_next = 0;
  for (int step = 0; step < 9; ++step) {
    ForwardOutput want;
    ASSERT_TRUE((*ref)->forward(std::vector<ModelSlice>{s}, &ref_cache, &want).is_ok());
    std::vector<ForwardOutput> got = ranks.forward({s});
    const std::vector<float>& w = want.logits[0];
    for (int r = 0; r < tp; ++r) {
      ASSERT_EQ(got[static_cast<size_t>(r)].logits[0].size(), w.size());
      // Every rank ends with the same hidden state, so the same logits, bit for bit.
      EXPECT_EQ(got[static_cast<size_t>(r)].logits[0], got[0].logits[0]) << "rank " << r;
    }
    const std::vector<float>& g = got[0].logits[0];
    const int64_t rows = static_cast<int64_t>(w.size()) / vocab;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t v = 0; v < vocab; ++v)
        worst = std::max(worst, std::fabs(g[i * vocab + v] - w[i * vocab + v]));
      ASSERT_EQ(argmax(g.data() + i * vocab, vocab), argmax(w.data() + i * vocab, vocab))
          << "step " << step << " row " << i;
    }
    ref_next = argmax(w.data() + (rows - 1) * vocab, vocab);
    tp_next = argmax(g.data() + (rows - 1) * vocab, vocab);
    ASSERT_EQ(tp_next, ref_next) << "greedy token of step " << step;
    pos += static_cast<int64_t>(s.tokens.size());
    next_token[0] = ref_next;
    s.tokens = next_token;
    s.start_pos = pos;
    s.logits_rows = {0};
  }
  EXPECT_LE(worst, kTolerance);
  std::printf("[ %-40s ] --tp %d --ep %d: %lld prompt tokens + 8 decode steps, worst |logit "
              "diff| %.3g (bound %.3g)\n", "tensor/expert parallel on CPU ranks", tp, layout.ep,
              (long long)prompt_len, worst, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelCpu,
                         ::testing::Values(Layout{2, 1}, Layout{4, 1}, Layout{2, 2}, Layout{4, 4},
                                           Layout{4, 2}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });

TEST(TensorParallel, ShapesThatDoNotSplitAreNamed) {
  auto cfg = load_minimax_m3_config(kModel);
  ASSERT_TRUE(cfg.is_ok());
  const Status s = check_tensor_parallel(*cfg, 3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--tp 3"), std::string::npos) << s.message();
  // M3.1-Flash: 64 query heads and 4 KV heads split over 8 ranks, two per KV head.
  MiniMaxM3Config flash;  // the struct's defaults are M3.1-Flash's shapes
  EXPECT_TRUE(check_tensor_parallel(flash, 8).is_ok());
  const RankSlices r5 = rank_slices(flash, 5, 8);
  EXPECT_EQ(r5.q_begin, 40);
  EXPECT_EQ(r5.q_count, 8);
  EXPECT_EQ(r5.kv_begin, 2);  // query heads 40-47 belong to KV group 40 / 16 = 2
  EXPECT_EQ(r5.kv_count, 1);
  EXPECT_EQ(rank_config(flash, 5, 8).intermediate_size, 3072 / 8);
}

// SGLang's layout: the expert-parallel ranks are among the tensor-parallel ones; rank r is
// expert-parallel rank r / (tp/ep) and moe-tp rank r % (tp/ep).
TEST(ExpertParallel, PlacementAndErrorsNameTheFlags) {
  MiniMaxM3Config flash;  // M3.1-Flash: 128 experts of intermediate 3072
  EXPECT_TRUE(check_tensor_parallel(flash, 8, 8).is_ok());
  EXPECT_TRUE(check_tensor_parallel(flash, 8, 2).is_ok());
  const Status not_dividing = check_tensor_parallel(flash, 4, 8);
  EXPECT_EQ(not_dividing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(not_dividing.message().find("--ep 8 must divide --tp 4"), std::string::npos)
      << not_dividing.message();
  MiniMaxM3Config six = flash;
  six.num_local_experts = 6;
  const Status experts = check_tensor_parallel(six, 4, 4);
  EXPECT_NE(experts.message().find("--ep 4: num_local_experts (6)"), std::string::npos)
      << experts.message();
  // --tp 8 --ep 8: rank 5 holds experts 80-95 whole.
  const RankSlices e8 = rank_slices(flash, 5, 8, 8);
  EXPECT_EQ(e8.expert_begin, 80);
  EXPECT_EQ(e8.expert_count, 16);
  EXPECT_EQ(e8.inter_begin, 0);
  EXPECT_EQ(e8.inter_count, 3072);
  EXPECT_EQ(e8.q_begin, 40);  // attention is split over the 8 ranks as without --ep
  EXPECT_EQ(rank_config(flash, 5, 8, 8).intermediate_size, 3072);
  EXPECT_EQ(rank_config(flash, 5, 8, 8).num_local_experts, 128);  // the router scores all
  // --tp 8 --ep 2: rank 5 is expert-parallel rank 1 (experts 64-127), moe-tp rank 1 of 4.
  const RankSlices e2 = rank_slices(flash, 5, 8, 2);
  EXPECT_EQ(e2.expert_begin, 64);
  EXPECT_EQ(e2.expert_count, 64);
  EXPECT_EQ(e2.inter_begin, 768);
  EXPECT_EQ(e2.inter_count, 768);
  // Without --ep every rank holds every expert's 1/tp slice.
  const RankSlices t8 = rank_slices(flash, 5, 8);
  EXPECT_EQ(t8.expert_begin, 0);
  EXPECT_EQ(t8.expert_count, 128);
  EXPECT_EQ(t8.inter_begin, 5 * 384);
}

}  // namespace
}  // namespace m3::minimax_m3
