#include "model/minimax_m3/tensor_parallel_runner.h"

#include <algorithm>
#include <string>

#include "backend/comm/gloo_communicator.h"
#include "loader/checkpoint.h"
#include "model/minimax_m3/paged_kv_copier.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "model/step_channel.h"

namespace m3 {

int64_t TensorParallelCpuRunner::bytes_per_page(const MiniMaxM3Config& cfg, int ranks, int dp,
                                                KvCacheDtype kv_dtype) {
  // Every rank holds the same number of KV heads (replicated past their count).
  CpuBackend probe_backend(1);
  minimax_m3::PagedKvCache probe(&probe_backend, minimax_m3::rank_config(cfg, 0, ranks, 1, dp),
                                 1, kv_dtype);
  return probe.bytes_per_page() * ranks;
}

Result<std::unique_ptr<TensorParallelCpuRunner>> TensorParallelCpuRunner::create(
    const MiniMaxM3Config& cfg, const WeightSource& src, int ranks, int ep, int threads_per_rank,
    int32_t num_pages, int dp, KvCacheDtype kv_dtype, bool whole_lm_head_on_rank0) {
  M3_RETURN_IF_ERROR(minimax_m3::check_tensor_parallel(cfg, ranks, ep, dp));
  LocalRanks local;
  M3_ASSIGN_OR_RETURN(local.comms, comm::create_local_gloo_group(ranks));
  return make(cfg, src, std::move(local), ep, threads_per_rank, num_pages, dp, kv_dtype,
              whole_lm_head_on_rank0);
}

Result<std::unique_ptr<TensorParallelCpuRunner>> TensorParallelCpuRunner::create_distributed(
    const MiniMaxM3Config& cfg, const WeightSource& src, LocalRanks local, int ep,
    int threads_per_rank, int32_t num_pages, int dp, KvCacheDtype kv_dtype,
    bool whole_lm_head_on_rank0) {
  if (local.comms.empty()) {
    return invalid_argument("[model.minimax_m3.tensor_parallel_runner] no local ranks");
  }
  const int world = local.comms[0]->size();
  M3_RETURN_IF_ERROR(minimax_m3::check_tensor_parallel(cfg, world, ep, dp));
  // The attention groups' communicators span processes, so they come joined with the ranks.
  const int attn_tp = world / std::max(dp, 1);
  const bool needs_attn = dp > 1 && attn_tp > 1;
  if (needs_attn ? local.attn_comms.size() != local.comms.size() : !local.attn_comms.empty()) {
    return invalid_argument(
        "[model.minimax_m3.tensor_parallel_runner] --dp " + std::to_string(dp) + " over " +
        std::to_string(world) + " ranks: " + std::to_string(local.attn_comms.size()) +
        " attention-group communicators for " + std::to_string(local.comms.size()) +
        " local ranks (expected " + std::to_string(needs_attn ? local.comms.size() : 0) + ")");
  }
  for (size_t i = 0; i < local.attn_comms.size(); ++i) {
    const int rank = local.first + static_cast<int>(i);
    const comm::Communicator* a = local.attn_comms[i].get();
    if (a == nullptr || a->rank() != rank % attn_tp || a->size() != attn_tp) {
      return invalid_argument("[model.minimax_m3.tensor_parallel_runner] rank " +
                              std::to_string(rank) + "'s attention-group communicator is not "
                              "rank " + std::to_string(rank % attn_tp) + " of " +
                              std::to_string(attn_tp));
    }
  }
  return make(cfg, src, std::move(local), ep, threads_per_rank, num_pages, dp, kv_dtype,
              whole_lm_head_on_rank0);
}

Result<std::unique_ptr<TensorParallelCpuRunner>> TensorParallelCpuRunner::make(
    const MiniMaxM3Config& cfg, const WeightSource& src, LocalRanks local, int ep,
    int threads_per_rank, int32_t num_pages, int dp, KvCacheDtype kv_dtype,
    bool whole_lm_head_on_rank0) {
  if (num_pages <= 0) {
    return invalid_argument("[model.minimax_m3.tensor_parallel_runner] KV cache of " +
                            std::to_string(num_pages) + " pages");
  }
  const int world = local.comms[0]->size();
  std::unique_ptr<TensorParallelCpuRunner> r(new TensorParallelCpuRunner());
  r->cfg_ = cfg;
  r->dp_ = dp;
  r->first_rank_ = local.first;
  r->distributed_ = static_cast<int>(local.comms.size()) < world;
  r->idle_wait_ = local.idle_wait;
  r->keepalive_ = std::move(local.keepalive);
  r->ranks_.resize(local.comms.size());
  // Each attention group's own communicator: given with the ranks when they span processes, made
  // here when every rank is in this process.
  const int attn_tp = world / dp;
  if (!local.attn_comms.empty()) {
    for (size_t i = 0; i < local.attn_comms.size(); ++i)
      r->ranks_[i].attn_comm = std::move(local.attn_comms[i]);
  } else if (dp > 1 && attn_tp > 1 && !r->distributed_) {
    for (int g = 0; g < dp; ++g) {
      M3_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<comm::Communicator>> group,
                          comm::create_local_gloo_group(attn_tp));
      for (int a = 0; a < attn_tp; ++a)
        r->ranks_[static_cast<size_t>(g * attn_tp + a)].attn_comm = std::move(group[a]);
    }
  }
  for (size_t i = 0; i < local.comms.size(); ++i) {
    Rank& k = r->ranks_[i];
    const int rank = local.first + static_cast<int>(i);
    k.comm = std::move(local.comms[i]);
    if (k.comm->rank() != rank || k.comm->size() != world) {
      return invalid_argument("[model.minimax_m3.tensor_parallel_runner] local rank " +
                              std::to_string(i) + " has communicator rank " +
                              std::to_string(k.comm->rank()) + " of " +
                              std::to_string(k.comm->size()) + ", expected " +
                              std::to_string(rank) + " of " + std::to_string(world));
    }
    k.backend = std::make_unique<CpuBackend>(std::max(1, threads_per_rank));
    minimax_m3::ParallelLayout layout{rank, world, k.comm.get(), ep};
    layout.dp = dp;
    layout.attn_comm = k.attn_comm.get();
    layout.whole_lm_head_on_rank0 = whole_lm_head_on_rank0;
    ReadCounter reads;
    {
      // The ranks share `src`: count this rank's reads on this thread.
      ReadCounter::Scope counting(&reads);
      M3_ASSIGN_OR_RETURN(k.model, minimax_m3::Model::load(cfg, src, k.backend.get(), layout));
    }
    r->bytes_read_.push_back(reads.total());
    k.cache = std::make_unique<minimax_m3::PagedKvCache>(k.backend.get(), k.model->config(),
                                                         num_pages, kv_dtype);
  }
  // HiCache's page copies: every rank's shard of a page (in any KV dtype), when this process
  // holds every rank of the one attention group (its pages are the same ids on every rank).
  if (!r->distributed_ && dp == 1) {
    std::vector<minimax_m3::PagedKvCache*> shards;
    for (Rank& k : r->ranks_) shards.push_back(k.cache.get());
    r->copier_ = std::make_unique<minimax_m3::PagedKvCacheCopier>(std::move(shards));
  }
  r->receive_status_.assign(r->ranks_.size(), Status::ok());
  for (size_t i = 0; i < r->ranks_.size(); ++i) {
    if (r->first_rank_ + static_cast<int>(i) == 0) continue;  // the engine thread's rank
    if (r->distributed_) {
      r->workers_.emplace_back([p = r.get(), i] { p->receive_status_[i] = p->receive_steps(i); });
    } else {
      r->workers_.emplace_back([p = r.get(), i] { p->worker(i); });
    }
  }
  return r;
}

TensorParallelCpuRunner::~TensorParallelCpuRunner() {
  if (distributed_) {
    // Rank 0 tells every rank to stop; the others' loops end when it does (or the group breaks).
    if (first_rank_ == 0 && health().is_ok()) (void)send_step(*ranks_[0].comm, nullptr);
    if (!health().is_ok()) {
      // A broken group may leave a rank waiting on a peer that never answers: the process is
      // exiting (Engine failure), so do not wait for it.
      for (std::thread& t : workers_) t.detach();
      return;
    }
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    start_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
}

void TensorParallelCpuRunner::record_failure(const Status& s) {
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (failure_.is_ok()) failure_ = s;
}

Status TensorParallelCpuRunner::health() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

Status TensorParallelCpuRunner::gather_group_outputs(size_t r, const ModelStep& step,
                                                     ModelOutput& out) {
  // Every rank knows the step, so every rank computes the same counts: each slice of group g > 0
  // sends its logits rows, then its captured hidden states, from rank g * attn_tp to rank 0. A
  // rank's forward() fails alike on every rank for a bad step (checked before any collective), so
  // either all ranks get here or none does.
  const bool other_groups = std::any_of(step.slices.begin(), step.slices.end(),
                                        [](const ModelSlice& s) { return s.dp_group != 0; });
  if (!other_groups) return Status::ok();  // rank 0 holds everything; every rank sees the same
  Rank& k = ranks_[r];
  const int rank = first_rank_ + static_cast<int>(r);
  const int world = k.comm->size();
  const int attn_tp = world / dp_;
  const int64_t vocab = cfg_.vocab_size;
  const int64_t hidden_per_token =
      static_cast<int64_t>(step.capture_layers.size()) * cfg_.hidden_size;
  auto logits_count = [&](const ModelSlice& s) {
    return static_cast<int64_t>(s.logits_rows.size()) * vocab;
  };
  auto hidden_count = [&](const ModelSlice& s) {
    return static_cast<int64_t>(s.tokens.size()) * hidden_per_token;
  };
  std::vector<int64_t> send_counts(static_cast<size_t>(world), 0);
  std::vector<int64_t> recv_counts(static_cast<size_t>(world), 0);
  std::vector<float> send, recv;
  const bool leader = rank % attn_tp == 0 && rank != 0;
  for (const ModelSlice& s : step.slices) {
    if (s.dp_group == 0) continue;
    const int from = s.dp_group * attn_tp;
    const int64_t n = logits_count(s) + hidden_count(s);
    if (rank == 0) recv_counts[static_cast<size_t>(from)] += n;
    if (leader && from == rank) send_counts[0] += n;
  }
  if (leader) {
    send.reserve(static_cast<size_t>(send_counts[0]));
    for (size_t i = 0; i < step.slices.size(); ++i) {
      if (step.slices[i].dp_group * attn_tp != rank) continue;
      const ModelSlice& s = step.slices[i];
      if (static_cast<int64_t>(out.logits[i].size()) != logits_count(s) ||
          (hidden_per_token > 0 && static_cast<int64_t>(out.hidden[i].size()) != hidden_count(s))) {
        // Cannot happen unless the model's output shape changes; every rank would then disagree.
        return internal_error("[model.minimax_m3.tensor_parallel_runner] rank " +
                              std::to_string(rank) + ": slice " + std::to_string(i) +
                              "'s output is not its logits rows and captured tokens");
      }
      send.insert(send.end(), out.logits[i].begin(), out.logits[i].end());
      if (hidden_per_token > 0) send.insert(send.end(), out.hidden[i].begin(), out.hidden[i].end());
    }
  }
  int64_t total_recv = 0;
  for (int64_t c : recv_counts) total_recv += c;
  recv.resize(static_cast<size_t>(total_recv));
  M3_RETURN_IF_ERROR(k.comm->all_to_all_v(send.data(), send_counts, recv.data(), recv_counts,
                                          comm::DataType::kF32));
  if (rank != 0) return Status::ok();
  // Rank 0: the rows arrive grouped by sender (ascending group), each in slice order.
  std::vector<int64_t> offset(static_cast<size_t>(world), 0);
  for (int from = 1; from < world; ++from)
    offset[static_cast<size_t>(from)] =
        offset[static_cast<size_t>(from - 1)] + recv_counts[static_cast<size_t>(from - 1)];
  for (size_t i = 0; i < step.slices.size(); ++i) {
    const ModelSlice& s = step.slices[i];
    if (s.dp_group == 0) continue;
    int64_t& at = offset[static_cast<size_t>(s.dp_group * attn_tp)];
    const float* p = recv.data() + at;
    out.logits[i].assign(p, p + logits_count(s));
    p += logits_count(s);
    if (hidden_per_token > 0) out.hidden[i].assign(p, p + hidden_count(s));
    at += logits_count(s) + hidden_count(s);
  }
  return Status::ok();
}

Status TensorParallelCpuRunner::receive_steps(size_t r) {
  Rank& k = ranks_[r];
  for (;;) {
    // Every rank receives the step over the world group (step_channel.h).
    Result<std::optional<WireStep>> step = receive_step(*k.comm, idle_wait_);
    if (!step.is_ok()) {
      record_failure(step.status());
      return step.status();
    }
    if (!step->has_value()) return Status::ok();  // node 0 shut down
    const ModelStep& st = (*step)->step;
    ModelOutput out;
    Status s = k.model->forward(st.slices, k.cache.get(), &out, st.capture_layers);
    if (s.is_ok() && dp_ > 1) s = gather_group_outputs(r, st, out);
    // A bad input fails every rank alike (rank 0 reports it); a collective failure breaks the
    // group.
    if (s.code() == StatusCode::kUnavailable) {
      record_failure(s);
      return s;
    }
  }
}

Status TensorParallelCpuRunner::follow() {
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  for (const Status& s : receive_status_) {
    if (!s.is_ok()) return s;
  }
  return Status::ok();
}

void TensorParallelCpuRunner::worker(size_t r) {
  uint64_t seen = 0;
  while (true) {
    const ModelStep* step = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      step = step_;
    }
    Rank& k = ranks_[r];
    k.status = k.model->forward(step->slices, k.cache.get(), &k.out, step->capture_layers);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    done_.notify_all();
  }
}

Status TensorParallelCpuRunner::forward(const ModelStep& step, ModelOutput& out) {
  if (distributed_) {
    if (first_rank_ != 0) {
      return internal_error("[model.minimax_m3.tensor_parallel_runner] forward() on a process "
                            "without rank 0 (it follows node 0)");
    }
    M3_RETURN_IF_ERROR(health());
    Status s = send_step(*ranks_[0].comm, &step);
    if (s.is_ok()) {
      Rank& first = ranks_[0];
      s = first.model->forward(step.slices, first.cache.get(), &out, step.capture_layers);
    }
    if (s.is_ok() && dp_ > 1) s = gather_group_outputs(0, step, out);
    if (s.code() == StatusCode::kUnavailable) record_failure(s);
    return s;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = &step;
    pending_ = ranks_.size() - 1;
    ++generation_;
  }
  start_.notify_all();
  Rank& first = ranks_[0];
  Status s = first.model->forward(step.slices, first.cache.get(), &out, step.capture_layers);
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    step_ = nullptr;
  }
  if (!s.is_ok()) return s;
  for (size_t r = 1; r < ranks_.size(); ++r) {
    if (!ranks_[r].status.is_ok()) return ranks_[r].status;
  }
  if (dp_ > 1) {
    // Rank 0 holds group 0's slices' output; each other group's first rank holds its group's.
    const size_t attn_tp = ranks_.size() / static_cast<size_t>(dp_);
    for (size_t i = 0; i < step.slices.size(); ++i) {
      const size_t g = static_cast<size_t>(step.slices[i].dp_group);
      if (g == 0) continue;
      ModelOutput& from = ranks_[g * attn_tp].out;
      out.logits[i] = std::move(from.logits[i]);
      if (!out.hidden.empty()) out.hidden[i] = std::move(from.hidden[i]);
    }
  }
  return Status::ok();
}

int32_t TensorParallelCpuRunner::vocab_size() const {
  return static_cast<int32_t>(cfg_.vocab_size);
}
int32_t TensorParallelCpuRunner::hidden_size() const {
  return static_cast<int32_t>(cfg_.hidden_size);
}
int32_t TensorParallelCpuRunner::num_kv_pages() const {
  return static_cast<int32_t>(ranks_[0].cache->num_pages());
}
int32_t TensorParallelCpuRunner::page_size() const {
  return static_cast<int32_t>(ranks_[0].cache->page_size());
}

}  // namespace m3
