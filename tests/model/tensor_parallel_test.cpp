// Tensor parallelism of the float32 model on CPU ranks (model/minimax_m3/tensor_parallel.h): the
// bundled model split over 2 ranks (one KV head each) and 4 ranks (each KV head on two ranks)
// against the unsharded model, for a prefill long enough that MSA block selection is active and
// then greedy decode steps. Every rank runs on its own thread with its own CPU backend, KV cache
// and Gloo communicator.
//
// Tolerance: sharding changes only the order of float32 sums: each rank sums its heads' (or
// intermediate columns') products, and the all-reduce adds the T partial sums. A reordered sum of
// K float32 terms differs by at most ~K·2^-24 of the sum of their magnitudes (Higham, ch. 3); in
// the bundled model that is ~1e-5 of the logits' scale per layer and the six layers keep it below
// 1e-4 in practice. The bound, 2e-3 absolute on logits of magnitude ~10, leaves a 20x margin and
// is 15x below the smallest top-1/top-2 margin the golden fixtures record (0.03), so the argmax
// and the greedy tokens must be equal.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

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

struct Rank {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<PagedKvCache> cache;
};

// Runs `step` on every rank at once (the collectives need all of them) and returns each rank's
// output.
std::vector<ForwardOutput> run_all(std::vector<Rank>& ranks, const std::vector<ModelSlice>& batch) {
  std::vector<ForwardOutput> outs(ranks.size());
  std::vector<Status> status(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      status[r] = ranks[r].model->forward(batch, ranks[r].cache.get(), &outs[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) EXPECT_TRUE(s.is_ok()) << s.to_string();
  return outs;
}

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

class TensorParallelCpu : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelCpu, ShardedEqualsUnsharded) {
  const int tp = GetParam();
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
  auto group = comm::create_local_gloo_group(tp);
  ASSERT_TRUE(group.is_ok()) << group.status().to_string();
  std::vector<Rank> ranks(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    Rank& k = ranks[static_cast<size_t>(r)];
    k.backend = std::make_unique<CpuBackend>(1);
    auto m = Model::load(*cfg, **ckpt, k.backend.get(), {r, tp, (*group)[static_cast<size_t>(r)].get()});
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    k.model = std::move(m).value();
    EXPECT_EQ(k.model->config().num_attention_heads, cfg->num_attention_heads / tp);
    k.cache = std::make_unique<PagedKvCache>(k.backend.get(), k.model->config(), pages);
  }

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
    std::vector<ForwardOutput> got = run_all(ranks, {s});
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
  std::printf("[ %-40s ] --tp %d: %lld prompt tokens + 8 decode steps, worst |logit diff| %.3g "
              "(bound %.3g)\n", "tensor parallel on CPU ranks", tp, (long long)prompt_len,
              worst, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallelCpu, ::testing::Values(2, 4));

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

}  // namespace
}  // namespace m3::minimax_m3
