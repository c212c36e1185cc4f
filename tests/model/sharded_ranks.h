// The float32 model loaded as every rank of a tensor- / expert-parallel layout
// (model/minimax_m3/tensor_parallel.h) in this process, each rank with its own CPU backend, KV
// cache and Gloo communicator, and a step run on all of them at once (the collectives need every
// rank). Shared by tensor_parallel_test.cpp and sharded_golden_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <span>
#include <thread>
#include <vector>

#include "backend/comm/gloo_communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "model/minimax_m3/tensor_parallel.h"

namespace m3::minimax_m3::testing {

struct Layout {
  int tp = 1, ep = 1;
  int dp = 1;  // attention data-parallel groups of tp / dp ranks
  std::string name() const {
    return "tp" + std::to_string(tp) + (ep > 1 ? "_ep" + std::to_string(ep) : std::string()) +
           (dp > 1 ? "_dp" + std::to_string(dp) : std::string());
  }
};

struct ShardedModel {
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  std::vector<std::unique_ptr<comm::Communicator>> attn_comms;  // per rank, under dp > 1
  int dp = 1;
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::unique_ptr<PagedKvCache>> caches;

  // Loads every rank of `layout` with KV caches of `pages` pages.
  Status load(const MiniMaxM3Config& cfg, const WeightSource& src, Layout layout, int64_t pages) {
    M3_ASSIGN_OR_RETURN(comms, comm::create_local_gloo_group(layout.tp));
    dp = layout.dp;
    const int group = layout.tp / layout.dp;
    attn_comms.resize(static_cast<size_t>(layout.tp));
    for (int g = 0; layout.dp > 1 && group > 1 && g < layout.dp; ++g) {
      M3_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<comm::Communicator>> c,
                          comm::create_local_gloo_group(group));
      for (int a = 0; a < group; ++a)
        attn_comms[static_cast<size_t>(g * group + a)] = std::move(c[a]);
    }
    for (int r = 0; r < layout.tp; ++r) {
      backends.push_back(std::make_unique<CpuBackend>(1));
      ParallelLayout pl{r, layout.tp, comms[static_cast<size_t>(r)].get(), layout.ep};
      pl.dp = layout.dp;
      pl.attn_comm = attn_comms[static_cast<size_t>(r)].get();
      M3_ASSIGN_OR_RETURN(std::unique_ptr<Model> m,
                          Model::load(cfg, src, backends.back().get(), pl));
      caches.push_back(std::make_unique<PagedKvCache>(backends.back().get(), m->config(), pages));
      models.push_back(std::move(m));
    }
    return Status::ok();
  }

  // The rank whose output holds the slices of attention group g (its group's first rank).
  size_t first_of_group(int g) const { return static_cast<size_t>(g) * models.size() / dp; }

  // Runs `batch` on every rank at once; each rank's output (under dp > 1, a rank's holds its
  // group's slices only).
  std::vector<ModelOutput> forward(const std::vector<ModelSlice>& batch,
                                   std::span<const int32_t> capture_layers = {}) {
    std::vector<ModelOutput> outs(models.size());
    std::vector<Status> status(models.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < models.size(); ++r) {
      threads.emplace_back(
          [&, r] { status[r] = models[r]->forward(batch, caches[r].get(), &outs[r], capture_layers);
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t r = 0; r < status.size(); ++r)
      EXPECT_TRUE(status[r].is_ok()) << "rank " << r << ": " << status[r].to_string();
    return outs;
  }
};

// The unsharded LM head (final norm, then all V rows of `whole`'s lm_head) on rows `rows` of a
// sequence's residual stream after the last layer `hidden` [tokens, hd]: what a head split by
// vocabulary over ranks must reproduce bit for bit from the same hidden state.
inline std::vector<float> whole_head_logits(const Model& whole, const std::vector<float>& hidden,
                                            std::span<const int32_t> rows) {
  const MiniMaxM3Config& c = whole.config();
  const int64_t hd = c.hidden_size, vocab = c.vocab_size, n = static_cast<int64_t>(rows.size());
  std::vector<float> x(static_cast<size_t>(n * hd)), y(static_cast<size_t>(n * vocab));
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(hidden.data() + rows[static_cast<size_t>(i)] * hd, hd, x.data() + i * hd);
  CpuBackend be(1);  // host buffers: the model's weights are CPU memory
  be.rms_norm({x.data(), whole.weights().final_norm.data(), x.data(), n, hd,
               static_cast<float>(c.rms_norm_eps), true});
  be.linear({x.data(), whole.weights().lm_head.data(), y.data(), n, vocab, hd, false});
  return y;
}

}  // namespace m3::minimax_m3::testing
