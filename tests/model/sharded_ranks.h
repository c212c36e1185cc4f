// The float32 model loaded as every rank of a tensor- / expert-parallel layout
// (model/minimax_m3/tensor_parallel.h) in this process, each rank with its own CPU backend, KV
// cache and Gloo communicator, and a step run on all of them at once (the collectives need every
// rank). Shared by tensor_parallel_test.cpp and sharded_golden_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
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
  std::string name() const {
    return "tp" + std::to_string(tp) + (ep > 1 ? "_ep" + std::to_string(ep) : std::string());
  }
};

struct ShardedModel {
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  std::vector<std::unique_ptr<CpuBackend>> backends;
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::unique_ptr<PagedKvCache>> caches;

  // Loads every rank of `layout` with KV caches of `pages` pages.
  Status load(const MiniMaxM3Config& cfg, const WeightSource& src, Layout layout, int64_t pages) {
    M3_ASSIGN_OR_RETURN(comms, comm::create_local_gloo_group(layout.tp));
    for (int r = 0; r < layout.tp; ++r) {
      backends.push_back(std::make_unique<CpuBackend>(1));
      M3_ASSIGN_OR_RETURN(std::unique_ptr<Model> m,
                          Model::load(cfg, src, backends.back().get(),
                                      {r, layout.tp, comms[static_cast<size_t>(r)].get(),
                                       layout.ep}));
      caches.push_back(std::make_unique<PagedKvCache>(backends.back().get(), m->config(), pages));
      models.push_back(std::move(m));
    }
    return Status::ok();
  }

  // Runs `batch` on every rank at once; each rank's output.
  std::vector<ModelOutput> forward(const std::vector<ModelSlice>& batch) {
    std::vector<ModelOutput> outs(models.size());
    std::vector<Status> status(models.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < models.size(); ++r) {
      threads.emplace_back(
          [&, r] { status[r] = models[r]->forward(batch, caches[r].get(), &outs[r]); });
    }
    for (std::thread& t : threads) t.join();
    for (size_t r = 0; r < status.size(); ++r)
      EXPECT_TRUE(status[r].is_ok()) << "rank " << r << ": " << status[r].to_string();
    return outs;
  }
};

}  // namespace m3::minimax_m3::testing
