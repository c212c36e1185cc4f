#include "model/minimax_m3/expert_parallel_moe.h"

#include <string>
#include <vector>

namespace m3::minimax_m3 {
namespace {

template <typename T>
DeviceBuffer<T> upload(Backend* be, const std::vector<T>& host) {
  DeviceBuffer<T> b(be, static_cast<int64_t>(host.size()));
  if (!host.empty())
    be->copy_to_device(b.data(), host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
  return b;
}

template <typename T>
std::vector<T> download(Backend* be, const T* src, int64_t n) {
  std::vector<T> host(static_cast<size_t>(n));
  if (n > 0) be->copy_to_host(host.data(), src, n * static_cast<int64_t>(sizeof(T)));
  return host;
}

std::vector<int64_t> scaled(const std::vector<int64_t>& counts, int64_t by) {
  std::vector<int64_t> s(counts);
  for (int64_t& c : s) c *= by;
  return s;
}

}  // namespace

Status expert_parallel_moe(Backend* be, const ParallelLayout& layout,
                           const ExpertParallelMoeParams& p) {
  comm::Communicator* comm = layout.comm;
  const int world = layout.ranks, ep = layout.ep, moe_tp = layout.moe_tp();
  const int ep_rank = layout.ep_rank(), slice = layout.moe_tp_rank();
  const int64_t hd = p.hidden, kk = p.top_k, ne = p.num_experts;
  if (comm == nullptr || ep < 1 || world % ep != 0 || ne % ep != 0)
    return invalid_argument("[model.minimax_m3.expert_parallel_moe] " + std::to_string(ne) +
                            " experts over --ep " + std::to_string(ep) + " of --tp " +
                            std::to_string(world) + " ranks need a communicator and even splits");
  const int64_t per_rank = ne / ep;
  // This rank's share of the step's tokens within its moe-tp group.
  const int64_t t0 = p.tokens * ep_rank / ep, t1 = p.tokens * (ep_rank + 1) / ep, n = t1 - t0;

  // 1. Route the share: top-k expert ids (ascending per token) and their weights.
  std::vector<int32_t> ids;
  std::vector<float> weights;
  if (n > 0) {
    DeviceBuffer<float> logits(be, n * ne), w_d(be, n * kk);
    DeviceBuffer<int32_t> ids_d(be, n * kk);
    be->linear({p.x + t0 * hd, p.router, logits.data(), n, ne, hd, false});
    be->router_topk({logits.data(), p.router_bias, ids_d.data(), w_d.data(), n, ne, kk,
                     p.routed_scaling});
    be->synchronize();
    ids = download(be, ids_d.data(), n * kk);
    weights = download(be, w_d.data(), n * kk);
  }

  // 2. Dispatch: one row per (token, slot) to the rank holding the slot's expert at this rank's
  // intermediate slice, rows of one destination in (token, slot) order.
  auto owner = [&](int32_t e) { return static_cast<int>(e / per_rank) * moe_tp + slice; };
  std::vector<int64_t> send_pairs(static_cast<size_t>(world), 0);
  for (int32_t e : ids) {
    if (e < 0 || e >= ne)
      return internal_error("[model.minimax_m3.expert_parallel_moe] router chose expert " +
                            std::to_string(e) + " of " + std::to_string(ne));
    ++send_pairs[static_cast<size_t>(owner(e))];
  }
  std::vector<int64_t> fill(static_cast<size_t>(world), 0);
  for (int r = 1; r < world; ++r) fill[r] = fill[r - 1] + send_pairs[r - 1];
  const int64_t total_send = n * kk;
  std::vector<int32_t> send_rows(static_cast<size_t>(total_send)), send_ids(send_rows.size());
  std::vector<int64_t> pair_at(send_rows.size());  // where pair (t, s)'s row goes and comes back
  for (int64_t i = 0; i < total_send; ++i) {
    const int64_t at = fill[static_cast<size_t>(owner(ids[i]))]++;
    pair_at[i] = at;
    send_rows[at] = static_cast<int32_t>(t0 + i / kk);
    send_ids[at] = static_cast<int32_t>(ids[i] % per_rank);  // the owner's local expert index
  }
  be->synchronize();
  const std::vector<int64_t> ones(static_cast<size_t>(world), 1);
  DeviceBuffer<int64_t> send_counts = upload(be, send_pairs), recv_counts(be, world);
  M3_RETURN_IF_ERROR(comm->all_to_all_v(send_counts.data(), ones, recv_counts.data(), ones,
                                        comm::DataType::kI64));
  const std::vector<int64_t> recv_pairs = download(be, recv_counts.data(), world);
  int64_t total_recv = 0;
  for (int64_t c : recv_pairs) total_recv += c;
  DeviceBuffer<int32_t> send_ids_d = upload(be, send_ids), recv_ids(be, total_recv);
  M3_RETURN_IF_ERROR(comm->all_to_all_v(send_ids_d.data(), send_pairs, recv_ids.data(),
                                        recv_pairs, comm::DataType::kI32));
  DeviceBuffer<int32_t> rows_d = upload(be, send_rows);
  DeviceBuffer<float> send_x(be, total_send * hd), recv_x(be, total_recv * hd);
  if (total_send > 0) be->gather_rows({p.x, rows_d.data(), send_x.data(), total_send, hd});
  be->synchronize();
  const std::vector<int64_t> send_floats = scaled(send_pairs, hd);
  const std::vector<int64_t> recv_floats = scaled(recv_pairs, hd);
  M3_RETURN_IF_ERROR(comm->all_to_all_v(send_x.data(), send_floats, recv_x.data(), recv_floats,
                                        comm::DataType::kF32));

  // 3. The owned experts on the received rows: one slot of weight 1 (exact), so each output row
  // is the expert's own output; the weighting is the token's rank's.
  DeviceBuffer<float> expert_out(be, total_recv * hd), back(be, total_send * hd);
  if (total_recv > 0) {
    DeviceBuffer<float> unit =
        upload(be, std::vector<float>(static_cast<size_t>(total_recv), 1.0f));
    be->moe_experts({recv_x.data(), p.w13, p.w2, recv_ids.data(), unit.data(), expert_out.data(),
                     total_recv, hd, p.inter, per_rank, 1, p.alpha, p.limit});
  }
  be->synchronize();
  M3_RETURN_IF_ERROR(comm->all_to_all_v(expert_out.data(), recv_floats, back.data(), send_floats,
                                        comm::DataType::kF32));

  // 4. Combine in ascending slot order, as the CPU backend's moe_experts sums; other ranks' tokens
  // stay zero for the layer's all-reduce.
  const std::vector<float> contrib = download(be, back.data(), total_send * hd);
  std::vector<float> out(static_cast<size_t>(p.tokens * hd), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    float* o = out.data() + (t0 + t) * hd;
    for (int64_t s = 0; s < kk; ++s) {
      const float w = weights[t * kk + s];
      const float* c = contrib.data() + pair_at[t * kk + s] * hd;
      if (s == 0) {
        for (int64_t i = 0; i < hd; ++i) o[i] = c[i] * w;
      } else {
        for (int64_t i = 0; i < hd; ++i) o[i] += c[i] * w;
      }
    }
  }
  be->copy_to_device(p.out, out.data(), static_cast<int64_t>(out.size() * sizeof(float)));
  return Status::ok();
}

}  // namespace m3::minimax_m3
