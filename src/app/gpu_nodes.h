// GPU ranks over several nodes (--device cuda --nnodes N --node-rank K --dist-init-addr HOST:PORT):
// one process per node drives that node's --tp / N GPUs (SGLang's layout), node K's GPUs being
// ranks K·tp/N .. (K+1)·tp/N - 1 of one NCCL group. Node 0 runs the engine and HTTP
// (make_engine: join_gpu_nodes before the runner loads); the other nodes load their GPUs' share
// and run the steps node 0 sends (follow_on_gpus). --ep and --enable-dp-attention --dp as within a
// node. docs/parallel.md, "Several nodes".
#pragma once

#include <string>

#include "app/engine_stack.h"
#include "app/multi_node.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"

namespace m3::app {

// A node other than node 0 on GPU ranks: joins the rendezvous, loads its GPUs' share of `cfg` /
// `weights` through options.make_cuda_runner (NCCL with node 0's unique id, the pool sized as node
// 0's: its --kv-cache-bytes, or the same profile step and then the fewest pages any GPU's memory
// allows), and follows node 0's steps. Returns as run_follower_node does (end_following).
// dp: --enable-dp-attention --dp (1: none), which node 0 must share (the rendezvous refuses
// another). It needs no collective of its own over nodes: every GPU holds every group's rows and
// the one attention all-reduce over all ranks hands rank 0 every group's outputs
// (cuda_m3_model.h, CudaTensorParallel::dp), so a follower's GPUs only load their group's share
// of the heads and pool and run attention on the slices of their group (ModelSlice::dp_group,
// which the step wire carries).
Result<int> follow_on_gpus(const MiniMaxM3Config& cfg, const WeightSource& weights,
                           const EngineStackOptions& options, int tp, int ep, int dp);

// The pool a follower's GPU offers after the profile step: what the step left free, less the
// headroom node 0's plan also leaves (kv_headroom_bytes). Node 0's plan (its fraction, context
// length and request cap) is at most that on the same GPUs, so the fewest pages over all GPUs
// is node 0's plan unless a follower's GPU holds less.
int64_t follower_pool_bytes(const MeasuredMemory& m);

}  // namespace m3::app
