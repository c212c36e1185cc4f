// Attention data parallelism on CPU ranks (--tp N --enable-dp-attention --dp D,
// model/minimax_m3/tensor_parallel_runner.h): the bundled model (8 query heads, 2 KV heads, 8
// routed experts) under --tp 2 --dp 2 (two groups of one rank: whole attention per group),
// --tp 4 --dp 2 (two groups of two ranks, one KV head each; the model's 2 KV heads leave no
// replication inside a group of 2) and --tp 4 --ep 2 --dp 2 (experts placed over the ranks, tokens
// dispatched by all-to-all from every group). Three sequences of different lengths spread over both
// groups, with overlapping page ids (each group has its own pool), run through
// TensorParallelCpuRunner: a prefill step, decode steps of all of them, a step where group 0 has no
// slices and one where group 1 has none. Each sequence's logits must match the unsharded model run
// on that sequence alone, and the greedy tokens must be equal; the last step also captures two
// layers' hidden states. --tp 2 --dp 2 and --tp 4 --ep 2 --dp 2 run again with every rank in its
// own "node" (create_distributed): rank 0 broadcasts the steps, the groups' communicators come with
// the ranks, and group 1's outputs travel from its first rank to rank 0.
//
// The last three layouts keep the KV cache (theirs and the reference's) in fp8_e4m3, fp4_e2m1 and
// bf16 (--kv-cache-dtype over CPU ranks); their bound is below, at the check.
//
// Tolerance: as in tensor_parallel_test.cpp, only the order of float32 sums changes (a group's
// ranks sum their heads' partial o_proj products, all ranks the feed-forward partial sums; under
// --ep the routed sum keeps the unsharded slot order). The gather of the groups' rows and the
// selection of a group's rows are copies. A reordered sum of K terms moves by at most ~K·2^-24 of
// the magnitudes' sum, ~1e-5 of the logits' scale per layer here; the same bound as the
// tensor-parallel test, 2e-3 absolute on logits of magnitude ~10, leaves a 20x margin and is 15x
// below the smallest top-1/top-2 margin the golden fixtures record, so the argmax must be equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/comm/gloo_communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "loader/checkpoint.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "model/minimax_m3/tensor_parallel_runner.h"

namespace m3::minimax_m3 {
namespace {

const std::string kModel = std::string(M3_REPO_ROOT) + "/models/m3-tiny";
constexpr float kTolerance = 2e-3f;

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

struct DpLayout {
  int tp = 2, ep = 1, dp = 2;
  // Every rank in its own "node" (create_distributed, one rank per LocalRanks, each attention
  // group's communicator given with the ranks): a group's ranks sit in different nodes, and
  // group g > 0's first rank, which holds its outputs, is not in rank 0's.
  bool nodes = false;
  // The KV caches' storage, the reference's too (--kv-cache-dtype).
  KvCacheDtype kv = KvCacheDtype::kFloat32;
  std::string name() const {
    return "tp" + std::to_string(tp) + (ep > 1 ? "_ep" + std::to_string(ep) : std::string()) +
           "_dp" + std::to_string(dp) + (nodes ? "_nodes" + std::to_string(tp) : std::string()) +
           (kv != KvCacheDtype::kFloat32 ? std::string("_") + kv_cache_dtype_name(kv) : "");
  }
};

// Ranks 1 .. tp - 1 as followers of rank 0, each in its own LocalRanks as if in another process,
// running the steps rank 0 broadcasts until it is destroyed (which stops them).
struct Followers {
  std::vector<std::unique_ptr<TensorParallelCpuRunner>> runners;
  std::vector<Status> ends;
  std::vector<std::thread> threads;
  ~Followers() {
    for (std::thread& t : threads) t.join();
  }
};

// Rank 0's runner over `tp` one-rank "nodes"; the others go into `followers`.
Result<std::unique_ptr<TensorParallelCpuRunner>> create_over_nodes(const MiniMaxM3Config& cfg,
                                                                   const WeightSource& src,
                                                                   const DpLayout& layout,
                                                                   int32_t pages,
                                                                   Followers* followers) {
  M3_ASSIGN_OR_RETURN(auto world, comm::create_local_gloo_group(layout.tp));
  std::vector<std::unique_ptr<comm::Communicator>> attn;
  const int attn_tp = layout.tp / layout.dp;
  if (attn_tp > 1) {
    for (int g = 0; g < layout.dp; ++g) {
      M3_ASSIGN_OR_RETURN(auto group, comm::create_local_gloo_group(attn_tp));
      for (auto& c : group) attn.push_back(std::move(c));
    }
  }
  std::vector<std::unique_ptr<TensorParallelCpuRunner>> made;
  for (int r = 0; r < layout.tp; ++r) {
    LocalRanks local;
    local.first = r;
    local.comms.push_back(std::move(world[static_cast<size_t>(r)]));
    if (attn_tp > 1) local.attn_comms.push_back(std::move(attn[static_cast<size_t>(r)]));
    M3_ASSIGN_OR_RETURN(auto runner,
                        TensorParallelCpuRunner::create_distributed(
                            cfg, src, std::move(local), layout.ep, 1, pages, layout.dp,
                            layout.kv));
    made.push_back(std::move(runner));
  }
  followers->ends.assign(made.size(), Status::ok());
  for (size_t r = 1; r < made.size(); ++r) {
    followers->runners.push_back(std::move(made[r]));
    TensorParallelCpuRunner* f = followers->runners.back().get();
    followers->threads.emplace_back([f, followers, r] { followers->ends[r] = f->follow(); });
  }
  return std::move(made[0]);
}

// One sequence: its group, its pages in its group's pool and in the reference cache, its tokens.
struct Sequence {
  int32_t group = 0;
  std::vector<int32_t> group_pages, ref_pages;
  std::vector<int32_t> tokens;  // this step's
  int64_t pos = 0;              // tokens already in the cache
};

class DpAttentionCpu : public ::testing::TestWithParam<DpLayout> {};

TEST_P(DpAttentionCpu, GroupsMatchTheUnshardedModelPerSequence) {
  const DpLayout layout = GetParam();
  auto cfg = load_minimax_m3_config(kModel);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto ckpt = Checkpoint::open(kModel);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const int64_t vocab = cfg->vocab_size;
  constexpr int32_t kPagesPerGroup = 6;

  Followers followers;  // declared before rank 0's runner: destroyed after it has stopped them
  auto runner = layout.nodes ? create_over_nodes(*cfg, **ckpt, layout, kPagesPerGroup, &followers)
                             : TensorParallelCpuRunner::create(*cfg, **ckpt, layout.tp, layout.ep,
                                                               1, kPagesPerGroup, layout.dp,
                                                               layout.kv);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  TensorParallelCpuRunner& tp = **runner;
  EXPECT_EQ(tp.dp_groups(), layout.dp);
  EXPECT_EQ(tp.num_ranks(), layout.tp);
  EXPECT_EQ(tp.num_kv_pages(), kPagesPerGroup);

  // The unsharded reference: every sequence alone, on its own pages of one cache.
  CpuBackend ref_backend(1);
  auto ref = Model::load(*cfg, **ckpt, &ref_backend);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  PagedKvCache ref_cache(&ref_backend, (*ref)->config(), 3 * kPagesPerGroup, layout.kv);
  // With a quantised cache, also the same reference over a float32 cache: D, the largest logit
  // deviation the storage format's rounding causes, scales the bound below.
  const bool quantised = layout.kv != KvCacheDtype::kFloat32;
  PagedKvCache ref_cache32(&ref_backend, (*ref)->config(), 3 * kPagesPerGroup);
  float format_dev = 0;
  struct Disagreement {
    float margin;  // the reference's top-1 / top-2 margin on that row
    std::string where;
  };
  std::vector<Disagreement> disagreements;

  // Group 0: a (70 tokens, three pages out of order). Group 1: b (41) and c (9), whose page ids
  // overlap a's: the groups' pools are separate.
  std::vector<Sequence> seqs(3);
  seqs[0] = {0, {4, 0, 2}, {0, 1, 2}, {}, 0};
  seqs[1] = {1, {0, 3}, {6, 7}, {}, 0};
  seqs[2] = {1, {2}, {12}, {}, 0};
  const int64_t lengths[3] = {70, 41, 9};
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int64_t t = 0; t < lengths[i]; ++t)
      seqs[i].tokens.push_back(static_cast<int32_t>((t * 37 + 11 * (i + 1)) % vocab));

  // Steps, as the sequences taking part, in slice order (mixing the groups): prefill, decodes,
  // group 0 empty, group 1 empty, all again.
  const std::vector<std::vector<size_t>> steps = {{1, 0, 2}, {0, 2, 1}, {2, 1}, {0}, {1, 2, 0}};
  float worst = 0, worst_hidden = 0;
  for (size_t step_no = 0; step_no < steps.size(); ++step_no) {
    ModelStep step;
    // The last step also returns the first and the last layer's hidden states, which travel from
    // each group's first rank like the logits.
    const bool capture = step_no + 1 == steps.size();
    if (capture) step.capture_layers = {0, static_cast<int32_t>(cfg->num_hidden_layers - 1)};
    for (size_t i : steps[step_no]) {
      ModelSlice s;
      s.tokens = seqs[i].tokens;
      s.start_pos = seqs[i].pos;
      s.block_table = seqs[i].group_pages;
      s.dp_group = seqs[i].group;
      // Prefill: every row of a, the last of b, the first and last of c.
      const int32_t n = static_cast<int32_t>(seqs[i].tokens.size());
      if (i == 0) {
        for (int32_t r = 0; r < n; ++r) s.logits_rows.push_back(r);
      } else if (i == 2 && n > 1) {
        s.logits_rows = {0, n - 1};
      } else {
        s.logits_rows = {n - 1};
      }
      step.slices.push_back(s);
    }
    ModelOutput got;
    const Status ran = tp.forward(step, got);
    ASSERT_TRUE(ran.is_ok()) << "step " << step_no << ": " << ran.to_string();
    ASSERT_EQ(got.logits.size(), step.slices.size());
    for (size_t k = 0; k < step.slices.size(); ++k) {
      Sequence& seq = seqs[steps[step_no][k]];
      ModelSlice alone = step.slices[k];
      alone.block_table = seq.ref_pages;
      alone.dp_group = 0;
      ForwardOutput want;
      const Status r = (*ref)->forward(std::vector<ModelSlice>{alone}, &ref_cache, &want,
                                       step.capture_layers);
      ASSERT_TRUE(r.is_ok()) << r.to_string();
      if (quantised) {
        ForwardOutput want32;
        const Status r32 = (*ref)->forward(std::vector<ModelSlice>{alone}, &ref_cache32, &want32);
        ASSERT_TRUE(r32.is_ok()) << r32.to_string();
        ASSERT_EQ(want32.logits[0].size(), want.logits[0].size());
        for (size_t e = 0; e < want.logits[0].size(); ++e)
          format_dev = std::max(format_dev, std::fabs(want.logits[0][e] - want32.logits[0][e]));
      }
      if (capture) {
        ASSERT_EQ(got.hidden.size(), step.slices.size());
        ASSERT_EQ(got.hidden[k].size(), want.hidden[0].size()) << "slice " << k;
        ASSERT_FALSE(want.hidden[0].empty());
        // Relative to the hidden state's scale: the residual stream is not bounded like logits.
        for (size_t e = 0; e < want.hidden[0].size(); ++e)
          worst_hidden = std::max(worst_hidden, std::fabs(got.hidden[k][e] - want.hidden[0][e]) /
                                                    std::max(1.0f, std::fabs(want.hidden[0][e])));
      }
      const std::vector<float>& w = want.logits[0];
      const std::vector<float>& g = got.logits[k];
      ASSERT_EQ(g.size(), w.size()) << "step " << step_no << " slice " << k;
      const int64_t rows = static_cast<int64_t>(w.size()) / vocab;
      for (int64_t row = 0; row < rows; ++row) {
        for (int64_t v = 0; v < vocab; ++v)
          worst = std::max(worst, std::fabs(g[row * vocab + v] - w[row * vocab + v]));
        const float* wr = w.data() + row * vocab;
        if (argmax(g.data() + row * vocab, vocab) != argmax(wr, vocab)) {
          std::vector<float> top(wr, wr + vocab);
          std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
          disagreements.push_back({top[0] - top[1], "step " + std::to_string(step_no) +
                                                        " slice " + std::to_string(k) + " row " +
                                                        std::to_string(row)});
        }
      }
      // Greedy: the next token is the last row's argmax (equal on both sides, checked above).
      seq.pos += static_cast<int64_t>(seq.tokens.size());
      seq.tokens = {argmax(w.data() + (rows - 1) * vocab, vocab)};
    }
  }
  // A quantised cache rounds each stored element. The sharded run's reorderings (at most ~1e-5
  // relative per layer, as above) move an element across a rounding boundary with a probability
  // of about 1e-5 / q per layer, q the format's relative quantum (bf16 2^-8, fp8 2^-4, fp4 2^-3
  // of the block's largest value); a crossing changes that element by one quantum, as the
  // format's own rounding changes every element. So over L layers the sharded run moves from the
  // reference by at most about 2 L (1e-5 / q) D, D the largest logit deviation the format itself
  // causes (the reference over a float32 cache against it), on top of the float32 tolerance. The
  // argmax must agree wherever the reference's margin exceeds twice the bound.
  const double q = layout.kv == KvCacheDtype::kBF16    ? std::ldexp(1.0, -8)
                   : layout.kv == KvCacheDtype::kFp8E4M3 ? std::ldexp(1.0, -4)
                                                         : std::ldexp(1.0, -3);
  const float bound = kTolerance + static_cast<float>(2.0 * double(cfg->num_hidden_layers) *
                                                      (1e-5 / q) * double(format_dev));
  EXPECT_LE(worst, bound);
  EXPECT_LE(worst_hidden, bound);
  for (const Disagreement& d : disagreements)
    EXPECT_LE(d.margin, 2 * bound) << "argmax differs at " << d.where << " with a margin of "
                                   << d.margin;
  std::printf("[ %-40s ] %s: 3 sequences over 2 groups, 5 steps, worst |logit diff| %.3g, "
              "hidden %.3g (bound %.3g; format deviation D %.3g; %zu argmax differences)\n",
              "attention data parallel on CPU ranks", layout.name().c_str(), worst, worst_hidden,
              bound, format_dev, disagreements.size());

  // A slice naming a group that does not exist fails the step on every rank alike (before any
  // collective), and the runner goes on.
  ModelStep bad;
  ModelSlice s;
  std::vector<int32_t> one = {seqs[0].tokens[0]};
  s.tokens = one;
  s.start_pos = seqs[0].pos;
  s.block_table = seqs[0].group_pages;
  s.logits_rows = {0};
  s.dp_group = layout.dp;
  bad.slices.push_back(s);
  ModelOutput out;
  const Status refused = tp.forward(bad, out);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("dp_group " + std::to_string(layout.dp)), std::string::npos)
      << refused.message();
  bad.slices[0].dp_group = layout.dp - 1;
  const Status after = tp.forward(bad, out);
  EXPECT_TRUE(after.is_ok()) << after.to_string();
  EXPECT_TRUE(tp.health().is_ok());
}

INSTANTIATE_TEST_SUITE_P(Layouts, DpAttentionCpu,
                         ::testing::Values(DpLayout{2, 1, 2}, DpLayout{4, 1, 2}, DpLayout{4, 2, 2},
                                           DpLayout{2, 1, 2, true}, DpLayout{4, 2, 2, true},
                                           DpLayout{4, 2, 2, false, KvCacheDtype::kFp8E4M3},
                                           DpLayout{4, 1, 2, true, KvCacheDtype::kFp4E2M1},
                                           DpLayout{4, 1, 2, false, KvCacheDtype::kBF16}),
                         [](const ::testing::TestParamInfo<DpLayout>& i) {
                           return i.param.name();
                         });

// SGLang's layout: groups of tp / dp consecutive ranks; a rank's heads are those of its position in
// its group, its feed-forward slices those of its rank among all tp.
TEST(DpAttention, PlacementAndErrorsNameTheFlags) {
  MiniMaxM3Config flash;  // M3.1-Flash: 64 query heads, 4 KV heads, 128 experts of 3072
  EXPECT_TRUE(check_tensor_parallel(flash, 8, 1, 2).is_ok());
  const Status not_dividing = check_tensor_parallel(flash, 8, 1, 3);
  EXPECT_EQ(not_dividing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(not_dividing.message().find("--dp 3 must divide --tp 8"), std::string::npos)
      << not_dividing.message();
  MiniMaxM3Config six = flash;
  six.num_attention_heads = 12;  // 12 heads over 8 ranks would not split, over 8 / 2 = 4 they do
  EXPECT_TRUE(check_tensor_parallel(six, 8, 1, 2).is_ok());
  six.num_attention_heads = 6;  // 6 over 4 do not
  const Status heads = check_tensor_parallel(six, 8, 1, 2);
  EXPECT_EQ(heads.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(heads.message().find("--tp 8 --dp 2: num_attention_heads (6)"), std::string::npos)
      << heads.message();
  // --tp 8 --dp 2: rank 5 is rank 1 of group 1 (ranks 4-7): query heads 16-31, KV head 1.
  const RankSlices r5 = rank_slices(flash, 5, 8, 1, 2);
  EXPECT_EQ(r5.q_begin, 16);
  EXPECT_EQ(r5.q_count, 16);
  EXPECT_EQ(r5.kv_begin, 1);
  EXPECT_EQ(r5.kv_count, 1);
  EXPECT_EQ(r5.inter_begin, 5 * 384);  // the routed experts stay split over all 8
  EXPECT_EQ(r5.dense_begin, rank_slices(flash, 5, 8).dense_begin);
  EXPECT_EQ(rank_config(flash, 5, 8, 1, 2).num_attention_heads, 16);
  EXPECT_EQ(rank_config(flash, 5, 8, 1, 2).intermediate_size, 384);
  // --tp 16 --dp 2: groups of 8 ranks share the 4 KV heads two by two (replication in a group);
  // rank 13 is rank 5 of group 1: query heads 40-47, KV head 40 / 16 = 2.
  const RankSlices r13 = rank_slices(flash, 13, 16, 1, 2);
  EXPECT_EQ(r13.q_begin, 40);
  EXPECT_EQ(r13.kv_begin, 2);
  EXPECT_EQ(r13.kv_count, 1);
  // --dp 1 is tensor parallelism unchanged.
  const RankSlices plain = rank_slices(flash, 5, 8);
  EXPECT_EQ(plain.q_begin, 40);
  EXPECT_EQ(plain.q_count, 8);
}

TEST(DpAttention, RunnerRefusesBadLayoutsAndMissingGroupCommunicators) {
  auto cfg = load_minimax_m3_config(kModel);
  ASSERT_TRUE(cfg.is_ok());
  auto ckpt = Checkpoint::open(kModel);
  ASSERT_TRUE(ckpt.is_ok());
  auto odd = TensorParallelCpuRunner::create(*cfg, **ckpt, 4, 1, 1, 2, 3);
  ASSERT_FALSE(odd.is_ok());
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(odd.status().message().find("--dp 3 must divide --tp 4"), std::string::npos)
      << odd.status().message();
  // Over several processes the attention groups' communicators come joined with the ranks:
  // groups of two ranks without them are refused, naming --dp.
  LocalRanks local;
  auto comms = comm::create_local_gloo_group(4);
  ASSERT_TRUE(comms.is_ok());
  local.comms = std::move(comms).value();
  auto distributed =
      TensorParallelCpuRunner::create_distributed(*cfg, **ckpt, std::move(local), 1, 1, 2, 2);
  ASSERT_FALSE(distributed.is_ok());
  EXPECT_EQ(distributed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(distributed.status().message().find("--dp 2 over 4 ranks: 0 attention-group "
                                                "communicators for 4 local ranks"),
            std::string::npos)
      << distributed.status().message();
}

}  // namespace
}  // namespace m3::minimax_m3
