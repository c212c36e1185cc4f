#include "app/gpu_nodes.h"

#include <algorithm>
#include <cstdio>

#include "model/minimax_m3/cuda/fit_check.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "model/step_channel.h"

namespace m3::app {

int64_t follower_pool_bytes(const MeasuredMemory& m) {
  return std::max<int64_t>(0, m.free_bytes - kv_headroom_bytes(m.total_bytes));
}

Result<int> follow_on_gpus(const MiniMaxM3Config& cfg, const WeightSource& weights,
                           const EngineStackOptions& options, int tp, int ep, int dp) {
  const NodeLayout& nodes = options.nodes;
  if (!options.make_cuda_runner) {
    return Status(StatusCode::kUnimplemented,
                  "--tp " + std::to_string(tp) + " --device cuda: this m3serve has no GPU ranks");
  }
  // GPU ranks run only on the real-shape kernels, each at its share of the shapes (make_engine
  // refuses the same on node 0). Under --dp a rank's heads are its attention group's share.
  M3_RETURN_IF_ERROR(check_gpu_ranks_fit(cfg, tp, ep, dp));
  // The rendezvous refuses a --dp other than node 0's before any GPU loads.
  M3_ASSIGN_OR_RETURN(std::shared_ptr<JoinedGpuNodes> joined, join_gpu_nodes(nodes, tp, dp));
  const std::function<std::string()> nodes_gone = joined->nodes_gone;
  // Each GPU's page is its attention group's share of the KV heads (as on node 0, whose page
  // bytes the agreed pool was planned with).
  CudaKvPoolRequest pool = gpu_pool_request(options, tp, ep, dp, std::move(joined));
  // The sizing itself (--kv-cache-bytes, or the profile step's tokens) is node 0's: the factory
  // takes it from the rendezvous (and notes a --kv-cache-bytes of this node's that differs).
  // With a profile step, this node offers what its GPUs hold.
  pool.kv_cache_bytes = options.kv_cache_bytes;
  pool.plan_pool_bytes = [](const MeasuredMemory& m) -> Result<int64_t> {
    return follower_pool_bytes(m);
  };
  M3_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                      options.make_cuda_runner(cfg, weights, pool));
  auto* follower = dynamic_cast<StepFollower*>(runner.get());
  if (follower == nullptr) {
    return internal_error("[app.gpu_nodes] the GPU runner of node " +
                          std::to_string(nodes.node_rank) + " cannot follow node 0's steps");
  }
  const std::string groups =
      dp > 1 ? " (its attention group's pool; " + std::to_string(dp) + " groups)" : "";
  std::fprintf(stderr, "m3serve: node %d of %d: ready: %d KV pages on each of %d GPUs%s; "
               "following node 0\n", nodes.node_rank, nodes.nnodes, runner->num_kv_pages(),
               tp / nodes.nnodes, groups.c_str());
  std::fflush(stderr);
  return end_following(nodes, follower->follow(), nodes_gone);
}

}  // namespace m3::app
