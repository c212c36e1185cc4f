#include "engine/engine.h"

#include <algorithm>
#include <climits>
#include <map>
#include <random>
#include <string>

#include "engine/engine_contexts.h"

namespace m3 {

struct Engine::Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<ReqCtx>> submitted;
  std::vector<RequestId> cancelled;
  int32_t num_waiting_published = 0;  // the loop's count of waiting requests, for queue-full
  int32_t num_live = 0;               // submitted and not done
  bool stop = false;
};

struct Engine::Sink : CancelSink {
  explicit Sink(std::shared_ptr<Inbox> i) : inbox(std::move(i)) {}
  void cancel(RequestId id) override {
    {
      std::lock_guard<std::mutex> lock(inbox->mu);
      inbox->cancelled.push_back(id);
    }
    inbox->cv.notify_all();
  }
  std::shared_ptr<Inbox> inbox;
};

Result<std::unique_ptr<Engine>> Engine::create(EngineConfig config,
                                               std::unique_ptr<ModelRunner> runner) {
  if (!runner) return invalid_argument("[engine] no model runner");
  SchedulerConfig& sc = config.scheduler;
  if (sc.page_size != runner->page_size()) {
    return invalid_argument("[engine] scheduler page size " + std::to_string(sc.page_size) +
                            " != model runner page size " + std::to_string(runner->page_size()));
  }
  // Attention data parallelism: the runner decides the groups; num_kv_pages() is per group.
  const int32_t dp_groups = runner->dp_groups();
  if (dp_groups < 1) {
    return invalid_argument("[engine] the model runner reports " + std::to_string(dp_groups) +
                            " data-parallel groups");
  }
  if (sc.num_dp_groups != 1 && sc.num_dp_groups != dp_groups) {
    return invalid_argument("[engine] scheduler configured for " +
                            std::to_string(sc.num_dp_groups) +
                            " data-parallel groups; the model runner has " +
                            std::to_string(dp_groups));
  }
  sc.num_dp_groups = dp_groups;
  if (sc.num_pages == 0) sc.num_pages = runner->num_kv_pages();
  if (sc.num_pages <= 0 || sc.num_pages > runner->num_kv_pages()) {
    return invalid_argument("[engine] KV pool of " + std::to_string(sc.num_pages) +
                            " pages; the model runner holds " +
                            std::to_string(runner->num_kv_pages()));
  }
  if (sc.chunked_prefill_size <= 0) {
    return invalid_argument("--chunked-prefill-size " + std::to_string(sc.chunked_prefill_size) +
                            " must be positive");
  }
  if (sc.max_running_requests <= 0) {
    return invalid_argument("--max-running-requests " +
                            std::to_string(sc.max_running_requests) + " must be positive");
  }
  if (config.context_length < 0) {
    return invalid_argument("--context-length " + std::to_string(config.context_length) +
                            " is negative");
  }
  if (runner->vocab_size() <= 0) return invalid_argument("[engine] model vocab size is 0");
  return std::unique_ptr<Engine>(new Engine(std::move(config), std::move(runner)));
}

Engine::Engine(EngineConfig config, std::unique_ptr<ModelRunner> runner)
    : config_(std::move(config)), runner_(std::move(runner)) {
  sched_ = std::make_unique<Scheduler>(config_.scheduler);
  vocab_size_ = runner_->vocab_size();
  hidden_size_ = runner_->hidden_size();
  eos_ids_ = config_.generation_defaults.eos_token_ids;
  inbox_ = std::make_shared<Inbox>();
  sink_ = std::make_shared<Sink>(inbox_);
  if (config_.num_sampler_threads > 1) {
    sampler_pool_ = std::make_unique<ThreadPool>(config_.num_sampler_threads);
  }
  publish_stats();
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    inbox_->stop = true;
  }
  inbox_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
  // Nobody is left waiting forever: every live request gets a final event.
  drain_inbox();
  std::vector<RequestId> ids;
  for (auto& [id, r] : requests_) ids.push_back(id);
  for (RequestId id : ids) cancel_request(id, FinishReason::kCancelled, Status::ok());
}

Status Engine::enable_hicache(const HiCacheOptions& options) {
  if (started_) return internal_error("[engine] enable_hicache after start()");
  KvPageCopier* copier = runner_->kv_page_copier();
  if (copier == nullptr) {
    return invalid_argument("--enable-hierarchical-cache: this model runner cannot copy KV pages "
                            "to host memory");
  }
  if (runner_->dp_groups() > 1) {
    return invalid_argument("--enable-hierarchical-cache is not supported with attention data "
                            "parallelism (--enable-dp-attention)");
  }
  HiCacheOptions o = options;
  o.page_size = config_.scheduler.page_size;
  M3_ASSIGN_OR_RETURN(std::unique_ptr<HiCache> hicache, make_hicache(copier, o));
  M3_RETURN_IF_ERROR(sched_->enable_hicache(std::move(hicache)));
  publish_stats();
  return Status::ok();
}

void Engine::start() {
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { loop(); });
}

SamplingParams Engine::default_sampling_params() const {
  return m3::default_sampling_params(config_.generation_defaults);
}

Status Engine::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

void Engine::fail_everything(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    failure_ = why;
  }
  failed_.store(true);
  fail_new_requests();
  if (config_.on_failure) config_.on_failure(why);
}

void Engine::fail_new_requests() {
  drain_inbox();
  const Status why = failure();
  std::vector<RequestId> ids;
  for (auto& [id, r] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (RequestId id : ids) cancel_request(id, FinishReason::kError, why);
}

namespace {

// The prefix-cache key of a prompt with input embeddings: its tokens, with each embedded position
// replaced by a negative value (never a token id) mixed from the embeddings' content hash and the
// position within them (splitmix64). The same image at the same place keys the same; another
// image differs at every one of its positions.
std::vector<int32_t> prompt_cache_key(const GenerateRequest& r) {
  if (r.prompt_embeddings.empty()) return {};
  std::vector<int32_t> key = r.prompt_tokens;
  for (const PromptEmbeddings& e : r.prompt_embeddings) {
    for (int32_t i = 0; i < e.num_tokens; ++i) {
      uint64_t z = e.content_hash + 0x9e3779b97f4a7c15ull * uint64_t(i + 1);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      key[size_t(e.token_offset + i)] = static_cast<int32_t>(0x80000000u | uint32_t(z));
    }
  }
  return key;
}

}  // namespace

Status Engine::check_prompt_embeddings(const GenerateRequest& r) const {
  if (r.prompt_embeddings.empty()) return Status::ok();
  if (!runner_->features().input_embeddings) {
    return Status(StatusCode::kUnimplemented,
                  "this model runner does not take input embeddings (image features)");
  }
  const int64_t prompt_len = static_cast<int64_t>(r.prompt_tokens.size());
  int64_t end_of_previous = 0;
  for (size_t i = 0; i < r.prompt_embeddings.size(); ++i) {
    const PromptEmbeddings& e = r.prompt_embeddings[i];
    const std::string which = "prompt embeddings " + std::to_string(i);
    if (e.num_tokens < 1 || e.token_offset < end_of_previous ||
        int64_t(e.token_offset) + e.num_tokens > prompt_len) {
      return invalid_argument(which + " cover positions [" + std::to_string(e.token_offset) +
                              ", " + std::to_string(int64_t(e.token_offset) + e.num_tokens) +
                              "), not inside the prompt of " + std::to_string(prompt_len) +
                              " tokens after the previous ones");
    }
    if (!e.values || int64_t(e.values->size()) != int64_t(e.num_tokens) * hidden_size_) {
      return invalid_argument(which + " hold " +
                              std::to_string(e.values ? e.values->size() : 0) +
                              " values; expected " + std::to_string(e.num_tokens) + " x " +
                              std::to_string(hidden_size_));
    }
    end_of_previous = int64_t(e.token_offset) + e.num_tokens;
  }
  return Status::ok();
}

void Engine::attach_prompt_embeddings(const StepPlan& plan, ModelStep& step) const {
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqSlice& s = plan.seqs[i];
    auto owner = seq_owner_.find(s.seq_id);
    if (owner == seq_owner_.end()) continue;
    for (const PromptEmbeddings& e : owner->second.first->req.prompt_embeddings) {
      const int32_t lo = std::max(s.start_pos, e.token_offset);
      const int32_t hi = std::min(s.end_pos() - s.num_draft, e.token_offset + e.num_tokens);
      for (int32_t pos = lo; pos < hi; ++pos) {
        InputEmbedding in;
        in.token_index = pos - s.start_pos;
        in.values = std::span<const float>(
            e.values->data() + static_cast<size_t>(pos - e.token_offset) * hidden_size_,
            static_cast<size_t>(hidden_size_));
        step.slices[i].embeddings.push_back(in);
      }
    }
  }
}

Result<RequestHandle> Engine::submit(GenerateRequest request) {
  if (failed_.load()) return failure();
  if (draining_.load()) {
    return Status(StatusCode::kResourceExhausted, "the engine is draining (shutting down)");
  }
  const int32_t prompt_len = static_cast<int32_t>(request.prompt_tokens.size());
  if (prompt_len == 0) return invalid_argument("the prompt has no tokens");
  for (int32_t i = 0; i < prompt_len; ++i) {
    const int32_t t = request.prompt_tokens[i];
    if (t < 0 || t >= vocab_size_) {
      return invalid_argument("prompt token " + std::to_string(i) + " = " + std::to_string(t) +
                              " is not in the vocabulary [0, " + std::to_string(vocab_size_) +
                              ")");
    }
  }
  SamplingParams& p = request.params;
  M3_RETURN_IF_ERROR(validate_sampling_params(p, vocab_size_));
  M3_RETURN_IF_ERROR(check_prompt_embeddings(request));
  if (request.prompt_logits && p.n != 1) {
    return invalid_argument("prompt logits are returned for n = 1 only; got n = " +
                            std::to_string(p.n));
  }
  if (!p.stop.empty() && !config_.detokenizer) {
    return invalid_argument("stop strings need a detokenizer; this engine has none");
  }
  const int64_t ctx = config_.context_length;
  if (ctx > 0 && prompt_len >= ctx) {
    return invalid_argument("the prompt has " + std::to_string(prompt_len) +
                            " tokens; the context length is " + std::to_string(ctx) +
                            " (at least one token must be generated)");
  }
  int64_t max_tokens = p.max_tokens;
  if (max_tokens > 0 && ctx > 0 && prompt_len + max_tokens > ctx) {
    return invalid_argument("the prompt (" + std::to_string(prompt_len) + " tokens) + max_tokens (" +
                            std::to_string(max_tokens) + ") = " +
                            std::to_string(prompt_len + max_tokens) +
                            " exceeds the context length of " + std::to_string(ctx) + " tokens");
  }
  // The KV pool must hold one sequence to its end (the last sampled token's K/V is never needed),
  // otherwise preemption could never make room.
  const int64_t pool_tokens =
      static_cast<int64_t>(sched_->pool().num_pages()) * config_.scheduler.page_size;
  if (max_tokens > 0) {
    if (prompt_len + max_tokens - 1 > pool_tokens) {
      return invalid_argument("the prompt (" + std::to_string(prompt_len) +
                              " tokens) + max_tokens (" + std::to_string(max_tokens) +
                              ") needs more KV cache than the " + std::to_string(pool_tokens) +
                              " tokens this server holds");
    }
  } else {
    max_tokens = std::min<int64_t>(ctx > 0 ? ctx - prompt_len : INT32_MAX,
                                   pool_tokens - prompt_len + 1);
    if (max_tokens <= 0) {
      return invalid_argument("the prompt (" + std::to_string(prompt_len) +
                              " tokens) does not fit the KV cache of " +
                              std::to_string(pool_tokens) + " tokens");
    }
  }

  auto req = std::make_unique<ReqCtx>();
  req->max_tokens = static_cast<int32_t>(std::min<int64_t>(max_tokens, INT32_MAX));
  if (p.seed) {
    req->seed = *p.seed;
  } else {
    thread_local std::mt19937_64 gen{std::random_device{}()};
    req->seed = gen();
  }
  req->min_tokens_mask = eos_ids_;
  req->min_tokens_mask.insert(req->min_tokens_mask.end(), p.stop_token_ids.begin(),
                              p.stop_token_ids.end());
  req->stream = std::make_shared<RequestStream>();
  req->times.arrival = Clock::now();
  req->usage.prompt_tokens = prompt_len;
  for (int32_t i = 0; i < p.n; ++i) {
    auto seq = std::make_unique<SeqCtx>();
    seq->index = i;
    if (p.repetition_penalty != 1.0f) seq->penalties.set_prompt(request.prompt_tokens);
    seq->stop = StopStringFilter(p.stop);
    if (config_.detokenizer) {
      seq->detok = config_.detokenizer(request);
      if (!seq->detok) return internal_error("[engine] the detokenizer factory returned null");
    }
    req->seqs.push_back(std::move(seq));
  }
  req->num_unfinished = p.n;
  // A draft needs the context of every prompt position: requests that keep their prompt logits
  // (computed in full anyway) decode without it.
  req->speculative = draft_ != nullptr && !request.prompt_logits;
  if (req->speculative) {
    SamplingParams& d = req->draft_params;
    d.temperature = p.temperature;
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    d.min_p = p.min_p;
  }
  req->req = std::move(request);

  RequestId id;
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    const int32_t queued = inbox_->num_waiting_published +
                           static_cast<int32_t>(inbox_->submitted.size());
    if (queued >= config_.max_waiting_requests) {
      return Status(StatusCode::kResourceExhausted,
                    "the waiting queue is full (" + std::to_string(queued) +
                        " requests; --max-queued-requests " +
                        std::to_string(config_.max_waiting_requests) + ")");
    }
    id = next_request_id_.fetch_add(1);
    req->id = id;
    auto stream = req->stream;
    inbox_->submitted.push_back(std::move(req));
    ++inbox_->num_live;
    inbox_->cv.notify_all();
    return RequestHandle(id, std::move(stream), sink_);
  }
}

void Engine::cancel(RequestId id) { sink_->cancel(id); }

void Engine::drain_inbox() {
  std::vector<std::unique_ptr<ReqCtx>> submitted;
  std::vector<RequestId> cancelled;
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    submitted.swap(inbox_->submitted);
    cancelled.swap(inbox_->cancelled);
    // Until publish_stats() recounts them (after the step), the requests taken here are still
    // waiting: without this, for a whole step they count nowhere, and submit() lets requests
    // past a full queue (a 200 where a 429 was due) while stats() shows them missing.
    inbox_->num_waiting_published += static_cast<int32_t>(submitted.size());
  }
  for (auto& r : submitted) admit(std::move(r));
  for (RequestId id : cancelled) cancel_request(id, FinishReason::kCancelled, Status::ok());
}

void Engine::admit(std::unique_ptr<ReqCtx> req) {
  const int32_t P = config_.scheduler.page_size;
  const int32_t prompt_len = static_cast<int32_t>(req->req.prompt_tokens.size());
  // n > 1: siblings wait for sequence 0's prefill when there is a full page to share. A
  // speculative sequence uses only cached pages whose draft features are kept
  // (Scheduler::set_prefix_match_limit, set in enable_speculative).
  const bool share = config_.scheduler.enable_prefix_cache && (prompt_len - 1) / P >= 1;
  SeqId leader = -1;
  for (auto& seq : req->seqs) {
    seq->id = next_seq_id_++;
    SeqSpec spec;
    spec.id = seq->id;
    spec.request_id = req->id;
    spec.seq_index = seq->index;
    spec.prompt = req->req.prompt_tokens;
    spec.prompt_key = prompt_cache_key(req->req);
    spec.wait_for = (share && seq->index > 0) ? leader : -1;
    spec.match_prefix = !req->req.prompt_logits;
    if (seq->index == 0) leader = seq->id;
    Status st = sched_->add(std::move(spec));
    if (!st.is_ok()) {
      // Validation in submit() makes this unreachable; fail the request cleanly anyway.
      for (auto& s : req->seqs) {
        if (s->id >= 0) sched_->remove(s->id);
      }
      RequestEvent e;
      e.request_id = req->id;
      e.done = true;
      e.error = st;
      e.time = Clock::now();
      req->stream->push(std::move(e));
      std::lock_guard<std::mutex> lock(inbox_->mu);
      --inbox_->num_live;
      return;
    }
    seq_owner_[seq->id] = {req.get(), seq.get()};
  }
  prompt_tokens_total_ += prompt_len;
  RequestId id = req->id;
  requests_.emplace(id, std::move(req));
}

void Engine::finish_seq(ReqCtx* req, SeqCtx* seq, FinishReason reason, SeqDelta* delta) {
  if (seq->finished) return;
  seq->finished = true;
  delta->finish_reason = reason;
  if (!seq->stop.matched()) delta->text += seq->stop.flush();
  sched_->remove(seq->id);
  seq_owner_.erase(seq->id);
  --req->num_unfinished;
}

void Engine::emit(ReqCtx* req, std::vector<SeqDelta> deltas, const Status& error) {
  RequestEvent e;
  e.error = error;
  e.request_id = req->id;
  e.seqs = std::move(deltas);
  e.time = Clock::now();
  bool has_token = false;
  for (const auto& d : e.seqs) has_token = has_token || !d.tokens.empty();
  if (has_token && req->times.first_token == Clock::time_point{}) req->times.first_token = e.time;
  e.done = req->num_unfinished == 0;
  if (e.done) req->times.finished = e.time;
  if (req->req.prompt_logits && !req->prompt_logits_sent && (has_token || e.done) &&
      error.is_ok()) {
    req->prompt_logits_sent = true;
    e.prompt_logits = std::move(req->prompt_logits);
  }
  e.usage = req->usage;
  e.times = req->times;
  req->stream->push(std::move(e));
}

void Engine::cancel_request(RequestId id, FinishReason reason, const Status& error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    // Not admitted yet (still in the inbox) or already done.
    std::unique_ptr<ReqCtx> pending;
    {
      std::lock_guard<std::mutex> lock(inbox_->mu);
      auto& sub = inbox_->submitted;
      for (auto s = sub.begin(); s != sub.end(); ++s) {
        if ((*s)->id == id) {
          pending = std::move(*s);
          sub.erase(s);
          break;
        }
      }
    }
    if (!pending) return;
    admit(std::move(pending));
    it = requests_.find(id);
    if (it == requests_.end()) return;
  }
  ReqCtx* req = it->second.get();
  std::vector<SeqDelta> deltas;
  for (auto& seq : req->seqs) {
    if (seq->finished) continue;
    SeqDelta d;
    d.seq_index = seq->index;
    finish_seq(req, seq.get(), reason, &d);
    deltas.push_back(std::move(d));
  }
  emit(req, std::move(deltas), error);
  ++finished_total_;
  requests_.erase(it);
  std::lock_guard<std::mutex> lock(inbox_->mu);
  --inbox_->num_live;
}

bool Engine::has_work() const { return !requests_.empty(); }

bool Engine::run_step() {
  if (requests_.empty()) return false;
  if (draft_) propose_drafts();
  StepPlan plan = sched_->plan();
  if (plan.empty()) return false;
  const Clock::time_point now = Clock::now();
  for (const SeqSlice& s : plan.seqs) {
    auto it = requests_.find(s.request_id);
    if (it == requests_.end()) continue;
    ReqCtx* req = it->second.get();
    if (!req->scheduled) {
      req->scheduled = true;
      req->times.scheduled = now;
      if (const SequenceState* st = sched_->find(req->seqs[0]->id)) {
        req->usage.cached_tokens = std::max(0, st->num_cached_prompt_tokens);
      }
    }
  }
  // Slices of requests that want their prompt logits return a row for every prompt token.
  std::vector<ReqCtx*> prompt_rows(plan.seqs.size(), nullptr);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqSlice& s = plan.seqs[i];
    auto it = requests_.find(s.request_id);
    if (it == requests_.end() || !it->second->req.prompt_logits) continue;
    if (s.start_pos < static_cast<int32_t>(it->second->req.prompt_tokens.size())) {
      prompt_rows[i] = it->second.get();
    }
  }
  // Rows the runner may sample itself (on its device): those whose parameters need nothing but
  // the logits and the random key (device_sampling.h); the others get their logits back. A row
  // sampled on the device returns no logits, so none whose prompt logits are kept is offered.
  std::vector<std::optional<DeviceSampling>> sampling;
  if (runner_->samples_on_device()) {
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const SeqSlice& slice = plan.seqs[i];
      if (!slice.need_logits) continue;
      std::optional<DeviceSampling>& d = sampling.emplace_back();
      if (prompt_rows[i] != nullptr) continue;
      auto owner = seq_owner_.find(slice.seq_id);
      if (owner == seq_owner_.end()) continue;
      const ReqCtx* req = owner->second.first;
      const SeqCtx* seq = owner->second.second;
      if (req->speculative) continue;  // verified on the host
      const SamplingParams& p = req->req.params;
      const bool min_tokens_active =
          seq->penalties.num_output() < p.min_tokens && !req->min_tokens_mask.empty();
      if (device_samplable(p, min_tokens_active))
        d = device_sampling(p, sample_key(*req, *seq));
    }
  }
  LogitsOut out;
  ModelOutput model_out;
  std::vector<std::pair<RequestId, Status>> draft_failed;
  Status st;
  try {
    std::vector<bool> all_rows(plan.seqs.size());
    for (size_t i = 0; i < plan.seqs.size(); ++i) all_rows[i] = prompt_rows[i] != nullptr;
    ModelStep step = model_step(plan, sampling, all_rows);
    attach_prompt_embeddings(plan, step);
    // The draft reads the hidden states of every token of a speculative sequence.
    bool capture = false;
    for (const SeqSlice& s : plan.seqs) {
      auto owner = seq_owner_.find(s.seq_id);
      capture = capture || (owner != seq_owner_.end() && owner->second.first->speculative);
    }
    if (capture) step.capture_layers = draft_capture_layers_;
    // Pages loaded back from the host or disk tier at admission must be complete before the
    // forward reads them, and pages saved on eviction before their ids are written again; a GPU
    // copier orders that on the GPU, and other saves run on beside the forward.
    if (const HiCache* hc = sched_->hicache()) st = hc->copier->order_before_forward();
    if (st.is_ok()) st = runner_->forward(step, model_out);
    if (st.is_ok()) st = gather_step_logits(plan, step, model_out, vocab_size_, out);
    // Before the prompt logits are read: a row the runner sampled without being offered it has
    // no logits.
    if (st.is_ok()) st = check_step_output(plan, sampling, out);
    if (st.is_ok()) keep_prompt_logits(plan, step, model_out, prompt_rows);
    if (st.is_ok() && capture) draft_failed = feed_draft_context(plan, model_out);
    if (st.is_ok() && !draft_features_.empty()) invalidate_unrecorded_pages(plan);
  } catch (const std::exception& e) {
    st = internal_error(std::string("[engine] model forward threw: ") + e.what());
  }
  if (!st.is_ok()) {
    std::vector<RequestId> failed;
    for (const SeqSlice& s : plan.seqs) failed.push_back(s.request_id);
    std::sort(failed.begin(), failed.end());
    failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
    for (RequestId id : failed) cancel_request(id, FinishReason::kError, st);
    // A runner that cannot run another step (its ranks lost each other) fails everything now:
    // the next step would only wait out the same broken collective.
    if (Status health = runner_->health(); !health.is_ok()) {
      fail_everything(Status(StatusCode::kUnavailable, health.message()));
    }
    return true;
  }
  for (auto& [id, why] : draft_failed) cancel_request(id, FinishReason::kError, why);
  sched_->commit(plan);
  sample_and_emit(plan, out, model_out);
  return true;
}

void Engine::keep_prompt_logits(const StepPlan& plan, const ModelStep& step,
                                const ModelOutput& out, std::span<ReqCtx* const> prompt_rows) {
  const size_t V = static_cast<size_t>(vocab_size_);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    ReqCtx* req = prompt_rows[i];
    if (!req) continue;
    const size_t prompt_len = req->req.prompt_tokens.size();
    if (req->prompt_logits.empty()) req->prompt_logits.resize(prompt_len * V);
    const std::vector<int32_t>& rows = step.slices[i].logits_rows;
    for (size_t r = 0; r < rows.size(); ++r) {
      const size_t pos = static_cast<size_t>(plan.seqs[i].start_pos + rows[r]);
      if (pos >= prompt_len) continue;
      std::copy_n(out.logits[i].begin() + r * V, V, req->prompt_logits.begin() + pos * V);
    }
  }
}

RngKey Engine::sample_key(const ReqCtx& req, const SeqCtx& seq) {
  return RngKey{req.seed, static_cast<uint64_t>(seq.index), static_cast<uint64_t>(seq.generated)};
}

Status Engine::check_step_output(const StepPlan& plan,
                                 std::span<const std::optional<DeviceSampling>> sampling,
                                 const LogitsOut& out) const {
  const int32_t want = plan.num_logits();
  int32_t sampled = 0;
  if (!out.tokens.empty()) {
    if (out.tokens.size() != static_cast<size_t>(want))
      return internal_error("[engine] model returned " + std::to_string(out.tokens.size()) +
                            " sampled-token entries, expected " + std::to_string(want));
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      const int32_t t = out.tokens[i];
      if (t < -1 || t >= vocab_size_ ||
          (t >= 0 && (i >= sampling.size() || !sampling[i].has_value())))
        return internal_error("[engine] model returned token " + std::to_string(t) +
                              " for logits row " + std::to_string(i) +
                              (t >= 0 && t < vocab_size_ ? " (not asked to sample it)"
                                                         : " (outside the vocabulary)"));
      sampled += t >= 0 ? 1 : 0;
    }
  }
  if (out.vocab_size != vocab_size_ || out.num_rows() != want - sampled ||
      out.data.size() != static_cast<size_t>(out.num_rows()) * vocab_size_)
    return internal_error("[engine] model returned " + std::to_string(out.num_rows()) +
                          " logit rows of width " + std::to_string(out.vocab_size) +
                          ", expected " + std::to_string(want - sampled) + " of width " +
                          std::to_string(vocab_size_));
  return Status::ok();
}

void Engine::sample_and_emit(const StepPlan& plan, const LogitsOut& logits,
                             const ModelOutput& model_out) {
  // Phase 1: sample every row. Rows are independent (counter-based RNG keyed by the sequence's
  // own seed, index and position; penalty state is only read), so they run on the sampler pool in
  // any order with identical results. A row that fails (e.g. every logit masked) fails only its
  // own request.
  struct Row {
    ReqCtx* req = nullptr;
    SeqCtx* seq = nullptr;
    int32_t row = 0;            // in logits.data (when device_token < 0)
    int32_t device_token = -1;  // the token the runner sampled, else -1
    // A verify slice (its index in the plan, else -1): every row of its logits is read, and
    // `results` holds the accepted drafts and the target's next token.
    int32_t verify_slice = -1;
    std::vector<SampleResult> results;
    int32_t num_accepted = 0;
    Status error;
  };
  std::vector<Row> rows;
  int32_t logits_idx = -1, data_row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqSlice& slice = plan.seqs[i];
    if (!slice.need_logits) continue;
    ++logits_idx;
    const int32_t token = logits.tokens.empty() ? -1 : logits.tokens[logits_idx];
    const int32_t row = token >= 0 ? -1 : data_row++;
    auto owner = seq_owner_.find(slice.seq_id);
    if (owner == seq_owner_.end()) continue;
    Row& r = rows.emplace_back();
    r.req = owner->second.first;
    r.seq = owner->second.second;
    r.row = row;
    r.device_token = token;
    if (slice.num_draft > 0) r.verify_slice = static_cast<int32_t>(i);
  }
  auto sample_range = [&](int64_t begin, int64_t end) {
    SamplerScratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      Row& r = rows[i];
      if (r.verify_slice >= 0) {
        try {
          r.results = verify_slice(r.req, r.seq, plan.seqs[r.verify_slice],
                                   model_out.logits[r.verify_slice], &scratch, &r.num_accepted);
        } catch (const std::exception& e) {
          r.error = internal_error(std::string("[engine.verify] ") + e.what());
        }
        continue;
      }
      if (r.device_token >= 0) {  // sampled by the runner (no logprobs were asked for)
        r.results.push_back(SampleResult{r.device_token, 0.0f, {}});
        continue;
      }
      SampleInput in;
      in.logits = logits.row(r.row);
      in.params = &r.req->req.params;
      in.penalties = &r.seq->penalties;
      in.min_tokens_mask = r.req->min_tokens_mask;
      in.rng = sample_key(*r.req, *r.seq);
      try {
        r.results.push_back(sample_token(in, &scratch));
      } catch (const std::exception& e) {
        r.error = internal_error(std::string("[engine.sample] ") + e.what());
      }
    }
  };
  if (sampler_pool_ && rows.size() > 1) {
    sampler_pool_->parallel_for(static_cast<int64_t>(rows.size()), 1, sample_range);
  } else {
    sample_range(0, static_cast<int64_t>(rows.size()));
  }

  // Phase 2, in plan order: append, detect stop, build deltas.
  std::map<RequestId, std::vector<SeqDelta>> deltas;  // ordered: deterministic emission
  std::vector<std::pair<RequestId, Status>> failed;
  for (Row& row : rows) {
    ReqCtx* req = row.req;
    SeqCtx* seq = row.seq;
    if (!row.error.is_ok()) {
      failed.emplace_back(req->id, row.error);
      continue;
    }
    const SamplingParams& p = req->req.params;
    if (row.verify_slice >= 0) {
      // The accepted drafts have their K/V; the target's next token is the new anchor.
      const SeqSlice& slice = plan.seqs[row.verify_slice];
      std::vector<int32_t> emitted;
      for (const SampleResult& r : row.results) emitted.push_back(r.token);
      sched_->append_verified(seq->id, emitted, row.num_accepted);
      const int64_t committed = slice.start_pos + 1 + row.num_accepted;
      Status st;
      if (const SequenceState* s = sched_->find(seq->id)) {
        st = runner_->truncate(s->pages, committed);
      }
      if (st.is_ok()) {
        st = append_draft_context(seq, model_out, static_cast<size_t>(row.verify_slice),
                                  slice.start_pos, 0, 1 + row.num_accepted);
      }
      ++seq->spec_round;
      seq->proposal.clear();
      seq->proposal_pos = -1;
      ++req->usage.spec_verify_steps;
      req->usage.spec_draft_tokens += slice.num_draft;
      req->usage.spec_accepted_tokens += row.num_accepted;
      spec_draft_tokens_total_ += static_cast<uint64_t>(slice.num_draft);
      spec_accepted_tokens_total_ += static_cast<uint64_t>(row.num_accepted);
      const size_t len = static_cast<size_t>(row.num_accepted + 1);
      if (len < spec_accept_length_counts_.size()) ++spec_accept_length_counts_[len];
      if (!st.is_ok()) {
        failed.emplace_back(req->id, st);
        continue;
      }
    } else {
      sched_->append_token(seq->id, row.results.front().token);
    }

    auto& list = deltas[req->id];
    SeqDelta* d = nullptr;
    for (auto& x : list) {
      if (x.seq_index == seq->index) d = &x;
    }
    if (!d) {
      list.emplace_back();
      d = &list.back();
      d->seq_index = seq->index;
    }
    // Tokens in order; a verified run ends early where a stop condition or max_tokens lands
    // inside it (the sequence is removed with the tokens after it).
    for (SampleResult& r : row.results) {
      seq->penalties.add_output(r.token);
      ++seq->generated;
      ++req->usage.completion_tokens;
      ++generation_tokens_total_;
      GeneratedToken g;
      g.token = r.token;
      if (p.logprobs) {
        g.logprob = r.logprob;
        g.top_logprobs = std::move(r.top_logprobs);
      }
      d->tokens.push_back(std::move(g));

      const bool is_eos = std::find(eos_ids_.begin(), eos_ids_.end(), r.token) != eos_ids_.end();
      const bool is_stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(),
                                        r.token) != p.stop_token_ids.end();
      if ((is_eos && !p.ignore_eos) || is_stop_id) {
        d->stop_token = r.token;
        finish_seq(req, seq, FinishReason::kStop, d);
        break;
      }
      if (seq->detok) {
        d->text += seq->stop.push(seq->detok->push(r.token));
        if (seq->stop.matched()) {
          d->stop_string = seq->stop.matched_string();
          finish_seq(req, seq, FinishReason::kStop, d);
          break;
        }
      }
      if (seq->generated >= req->max_tokens) {
        finish_seq(req, seq, FinishReason::kLength, d);
        break;
      }
    }
  }
  for (auto& [id, st] : failed) {
    deltas.erase(id);
    cancel_request(id, FinishReason::kError, st);
  }
  for (auto& [id, list] : deltas) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    ReqCtx* req = it->second.get();
    std::sort(list.begin(), list.end(),
              [](const SeqDelta& a, const SeqDelta& b) { return a.seq_index < b.seq_index; });
    emit(req, std::move(list));
    if (req->num_unfinished == 0) {
      ++finished_total_;
      requests_.erase(it);
      std::lock_guard<std::mutex> lock(inbox_->mu);
      --inbox_->num_live;
    }
  }
}

void Engine::publish_stats() {
  EngineStats s;
  for (const auto& [id, req] : requests_) {
    bool running = false;
    for (const auto& seq : req->seqs) {
      const SequenceState* st = seq->finished ? nullptr : sched_->find(seq->id);
      running = running || (st && st->phase != SeqPhase::kWaiting);
    }
    (running ? s.num_requests_running : s.num_requests_waiting) += 1;
  }
  // Totals over the groups; per group too with attention data parallelism.
  const int32_t D = sched_->num_dp_groups();
  for (int32_t g = 0; g < D; ++g) {
    const PagePool& pool = sched_->pool(g);
    DpGroupStats gs;
    gs.kv_pages_used = pool.num_used();
    gs.kv_pages_cached = pool.num_cached_only();
    gs.kv_pages_free = pool.num_free();
    gs.kv_pages_total = pool.num_pages();
    gs.prefix_cache_hit_tokens_total = sched_->counters(g).num_prefix_hit_tokens;
    gs.num_preemptions_total = sched_->counters(g).num_preemptions;
    gs.num_seqs_running = sched_->num_running(g);
    gs.num_seqs_waiting = sched_->num_waiting(g);
    s.kv_pages_used += gs.kv_pages_used;
    s.kv_pages_cached += gs.kv_pages_cached;
    s.kv_pages_free += gs.kv_pages_free;
    s.kv_pages_total += gs.kv_pages_total;
    if (D > 1) s.dp_groups.push_back(gs);
  }
  s.prefix_cache_hit_tokens_total = sched_->counters().num_prefix_hit_tokens;
  s.prompt_tokens_total = prompt_tokens_total_;
  s.generation_tokens_total = generation_tokens_total_;
  s.num_preemptions_total = sched_->counters().num_preemptions;
  s.num_steps_total = sched_->counters().num_steps;
  s.num_requests_finished_total = finished_total_;
  s.draining = draining_.load();
  s.spec_accept_length_counts = spec_accept_length_counts_;
  s.spec_draft_tokens_total = spec_draft_tokens_total_;
  s.spec_accepted_tokens_total = spec_accepted_tokens_total_;
  if (const HiCache* hc = sched_->hicache()) {
    s.hicache_enabled = true;
    s.hicache_host_pages_used = hc->host->num_used();
    s.hicache_host_pages_total = hc->host->num_pages();
    s.hicache_host_hit_tokens_total = hc->counters.host_hit_tokens;
    s.hicache_disk_hit_tokens_total = hc->counters.disk_hit_tokens;
    s.hicache_load_seconds_bounds = hicache_load_seconds_bounds();
    s.hicache_load_seconds_counts = hc->counters.load_seconds_counts;
    s.hicache_load_seconds_sum = hc->counters.load_seconds_sum;
    s.hicache_loads_total = hc->counters.num_loads;
  }
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    inbox_->num_waiting_published = s.num_requests_waiting;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = s;
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s = stats_;
  }
  // The same count as submit()'s queue bound: the loop's waiting requests (including any taken
  // from the inbox during the current step) plus submissions it has not picked up yet.
  std::lock_guard<std::mutex> lock(inbox_->mu);
  s.num_requests_waiting =
      inbox_->num_waiting_published + static_cast<int32_t>(inbox_->submitted.size());
  s.draining = draining_.load();
  return s;
}

bool Engine::step() {
  M3_CHECK(!started_, "[engine.step] the engine thread is running");
  drain_inbox();
  if (failed_.load()) fail_new_requests();
  const bool work = has_work();
  if (work) {
    try {
      run_step();
    } catch (const std::exception& e) {
      const Status st = internal_error(std::string("[engine.step] ") + e.what());
      std::vector<RequestId> ids;
      for (auto& [id, r] : requests_) ids.push_back(id);
      for (RequestId id : ids) cancel_request(id, FinishReason::kError, st);
    }
  }
  publish_stats();
  return work;
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(inbox_->mu);
      inbox_->cv.wait(lock, [&] {
        return inbox_->stop || !inbox_->submitted.empty() || !inbox_->cancelled.empty() ||
               !requests_.empty();
      });
      if (inbox_->stop) break;
    }
    drain_inbox();
    if (failed_.load()) {  // a submit() that raced the failure
      fail_new_requests();
      publish_stats();
      continue;
    }
    bool progressed = true;
    try {
      progressed = run_step();
    } catch (const std::exception& e) {
      // A broken invariant in the step: fail what is in flight, keep serving.
      const Status st = internal_error(std::string("[engine.loop] ") + e.what());
      std::vector<RequestId> ids;
      for (auto& [id, r] : requests_) ids.push_back(id);
      for (RequestId id : ids) cancel_request(id, FinishReason::kError, st);
    }
    publish_stats();
    if (!progressed && !requests_.empty()) {
      // Nothing was schedulable (should not happen: every admitted request fits the pool alone).
      // Do not spin; new submissions or cancellations wake us.
      std::unique_lock<std::mutex> lock(inbox_->mu);
      inbox_->cv.wait_for(lock, std::chrono::milliseconds(1));
    }
  }
}

bool Engine::drain(std::chrono::milliseconds timeout) {
  draining_.store(true);
  const Clock::time_point deadline = Clock::now() + timeout;
  bool clean = true;
  if (started_) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(inbox_->mu);
        if (inbox_->num_live == 0) break;
      }
      if (Clock::now() >= deadline) {
        clean = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    {
      std::lock_guard<std::mutex> lock(inbox_->mu);
      inbox_->stop = true;
    }
    inbox_->cv.notify_all();
    thread_.join();
    started_ = false;
  } else {
    while (step()) {
      if (Clock::now() >= deadline) {
        clean = false;
        break;
      }
    }
  }
  drain_inbox();
  std::vector<RequestId> ids;
  for (auto& [id, r] : requests_) ids.push_back(id);
  clean = clean && ids.empty();
  for (RequestId id : ids) cancel_request(id, FinishReason::kCancelled, Status::ok());
  publish_stats();
  return clean;
}

}  // namespace m3
