#include "model/minimax_m3/expert_placement.h"

#include "model/minimax_m3/tensor_parallel.h"

namespace m3::minimax_m3 {

ExpertPlacement place_experts(const MiniMaxM3Config& cfg, int rank, int ranks, int ep) {
  const RankSlices s = rank_slices(cfg, rank, ranks, ep);
  ExpertPlacement p;
  p.num_experts = cfg.num_local_experts;
  p.ep = ep;
  p.ep_rank = rank / (ranks / ep);
  p.begin = s.expert_begin;
  p.count = s.expert_count;
  p.inter_begin = s.inter_begin;
  p.inter_count = s.inter_count;
  return p;
}

int expert_owner(const MiniMaxM3Config& cfg, int ep, int64_t expert) {
  const int64_t per = cfg.num_local_experts / ep;
  return static_cast<int>(expert / per);
}

int64_t real_shape_routed_expert_bytes(const MiniMaxM3Config& cfg, const ExpertPlacement& p) {
  const int64_t hd = cfg.hidden_size, in = p.inter_count;
  // NVFP4 [n, k]: n·k/2 packed bytes + n·k/16 E4M3 scales + one float multiplier.
  const auto nvfp4 = [](int64_t n, int64_t k) { return n * k / 2 + n * k / 16 + 4; };
  const int64_t per_expert = nvfp4(2 * in, hd) + nvfp4(hd, in);
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) moe_layers += cfg.is_moe_layer(i) ? 1 : 0;
  return moe_layers * p.count * per_expert;
}

}  // namespace m3::minimax_m3
