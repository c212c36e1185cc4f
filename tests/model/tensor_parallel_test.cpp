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
#include "model/minimax_m3/dummy_weights.h"
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
    const std::vector<int32_t> last = {static_cast<int32_t>(cfg->num_hidden_layers - 1)};
    std::vector<ForwardOutput> got = ranks.forward({s}, last);
    const std::vector<float>& w = want.logits[0];
    // The head is split by vocabulary over the ranks and gathered: every logit is the unsharded
    // head's dot product of the same final hidden state, so equal to it bit for bit.
    ASSERT_EQ(got[0].hidden.size(), 1u);
    EXPECT_EQ(got[0].logits[0], testing::whole_head_logits(**ref, got[0].hidden[0], s.logits_rows))
        << "step " << step;
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

// The LM head's vocabulary rows: the first V % T ranks hold one row more than V / T, in order.
TEST(TensorParallel, LmHeadVocabularySlices) {
  MiniMaxM3Config flash;  // M3.1-Flash
  const RankSlices two = rank_slices(flash, 1, 2);
  EXPECT_EQ(two.vocab_begin, flash.vocab_size / 2);
  EXPECT_EQ(two.vocab_count, flash.vocab_size / 2);
  MiniMaxM3Config odd = flash;
  odd.vocab_size = 4093;  // 4093 = 4·1023 + 1: rank 0 holds 1024 rows, ranks 1-3 1023
  int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    const RankSlices s = rank_slices(odd, r, 4, 2, 2);  // --ep and --dp do not change it
    EXPECT_EQ(s.vocab_begin, next) << "rank " << r;
    EXPECT_EQ(s.vocab_count, r == 0 ? 1024 : 1023) << "rank " << r;
    next += s.vocab_count;
  }
  EXPECT_EQ(next, 4093);
  EXPECT_EQ(rank_slices(odd, 0, 1).vocab_count, 4093);
}

// A vocabulary that does not split evenly (4093 over 4 ranks: 1024, 1023, 1023, 1023 rows), with
// and without attention data parallelism (--tp 4 --dp 2: every group's rows reach every rank's
// head slice): each group's logits equal the unsharded head's on the same final hidden state,
// bit for bit, and the whole model's within the sharding tolerance.
TEST(TensorParallel, UnevenVocabularyHeadIsBitwiseTheWholeHead) {
  auto tiny = load_minimax_m3_config(kModel);
  ASSERT_TRUE(tiny.is_ok());
  MiniMaxM3Config cfg = *tiny;
  cfg.vocab_size = 4093;
  DummyWeightSource src(cfg);
  CpuBackend ref_backend(1);
  auto ref = Model::load(cfg, src, &ref_backend);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  const int64_t page = cfg.index_block_size, pages = 4;
  const std::vector<int32_t> last = {static_cast<int32_t>(cfg.num_hidden_layers - 1)};
  for (int dp : {1, 2}) {
    testing::ShardedModel ranks;
    const Status loaded = ranks.load(cfg, src, testing::Layout{4, 1, dp}, pages);
    ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
    std::vector<ModelSlice> batch(2);
    std::vector<std::vector<int32_t>> tokens(2), tables(2), rows(2);  // the slices' storage
    for (int b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < page + 3 + b; ++i)
        tokens[b].push_back(static_cast<int32_t>((i * 53 + 7 + b) % cfg.vocab_size));
      tables[b] = {static_cast<int32_t>(2 * b), static_cast<int32_t>(2 * b + 1)};
      rows[b] = {0, static_cast<int32_t>(tokens[b].size() - 1)};
      batch[b].tokens = tokens[b];
      batch[b].block_table = tables[b];
      batch[b].logits_rows = rows[b];
      batch[b].dp_group = dp > 1 ? b : 0;
    }
    std::vector<ForwardOutput> got = ranks.forward(batch, last);
    for (int b = 0; b < 2; ++b) {
      const ForwardOutput& o = got[ranks.first_of_group(batch[b].dp_group)];
      ASSERT_EQ(o.logits[b].size(), 2u * cfg.vocab_size) << "dp " << dp << " seq " << b;
      EXPECT_EQ(o.logits[b], testing::whole_head_logits(**ref, o.hidden[b], batch[b].logits_rows))
          << "dp " << dp << " seq " << b;
      PagedKvCache cache(&ref_backend, cfg, pages);
      ModelSlice one = batch[b];
      one.dp_group = 0;
      ForwardOutput want;
      ASSERT_TRUE((*ref)->forward(std::vector<ModelSlice>{one}, &cache, &want).is_ok());
      for (size_t i = 0; i < want.logits[0].size(); ++i)
        ASSERT_NEAR(o.logits[b][i], want.logits[0][i], kTolerance) << "dp " << dp << " " << i;
    }
  }
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
