// The engine: one thread that loops plan (Scheduler) -> run model (ModelRunner) -> sample ->
// detect stop -> emit events, with continuous batching (requests join and leave at every step).
//
// Server API (thread-safe): submit() -> RequestHandle with a per-request event stream; cancel();
// stats() for /metrics; drain() for SIGTERM. Errors from submit():
//   invalid argument: empty prompt, token id out of range, bad sampling parameter,
//     prompt + max_tokens > context length (both numbers named), stop strings without a
//     detokenizer;
//   resource exhausted: the waiting queue is full (HTTP 429) or the engine is draining (HTTP 503;
//     tell them apart with is_draining()).
//
// Stop conditions, checked after every sampled token in this order: EOS (unless ignore_eos) or a
// stop token id -> "stop" (token kept in token ids, no text); a stop string in the text -> "stop"
// (text cut before it); max_tokens -> "length". EOS/stop ids are masked before min_tokens.
//
// Tests drive the engine synchronously with step() instead of start().
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/thread_pool.h"
#include "engine/detokenizer.h"
#include "engine/draft_feature_store.h"
#include "engine/model_step.h"
#include "engine/request.h"
#include "engine/request_stream.h"
#include "engine/stop_strings.h"
#include "model/draft_model.h"
#include "model/model.h"
#include "sample/logits_processor.h"
#include "sample/sampling_params.h"
#include "sample/speculative_verify.h"
#include "sched/scheduler.h"

namespace m3 {

struct EngineConfig {
  // num_pages 0 = all the runner's pages; page_size must equal the runner's.
  SchedulerConfig scheduler;
  int32_t context_length = 0;            // --context-length; 0 = no limit but the KV pool
  int32_t max_waiting_requests = 4096;   // submit() fails with resource exhausted beyond this
  GenerationDefaults generation_defaults;  // sampling defaults and EOS ids
  DetokenizerFactory detokenizer;          // optional: text output and stop strings
  // Threads sampling the rows of a step in parallel (1 = on the engine thread). Results do not
  // depend on it: the RNG is counter-based per sequence.
  int32_t num_sampler_threads = 1;
  // Called once, on the engine thread, when the runner reports that it cannot run any more steps
  // (ModelRunner::health() after a failed step): every request has then been failed with that
  // status, and submit() refuses new ones with it.
  std::function<void(const Status&)> on_failure;
};

// Speculative decoding with a draft model (Engine::enable_speculative; docs/dspark.md, "Engine").
struct SpeculativeOptions {
  // Tokens of a verify slice: the last committed token plus up to num_draft_tokens - 1 drafts
  // (--speculative-num-draft-tokens); at least 2, at most the draft's block size + 1.
  int32_t num_draft_tokens = 0;
  VerifyMethod method = VerifyMethod::kTokenWise;  // --speculative-use-block-verification: kBlock
  // Benchmarks only (--speculative-simulate-accept-length): 0 = off; L >= 1 commits exactly
  // min(L, drafts + 1) tokens per verify whatever the target says (the output is NOT the
  // target's distribution).
  int32_t simulate_accept_length = 0;
};

// One attention data-parallel group's KV pool and prefix cache (EngineStats::dp_groups).
struct DpGroupStats {
  int32_t kv_pages_used = 0;
  int32_t kv_pages_cached = 0;
  int32_t kv_pages_free = 0;
  int32_t kv_pages_total = 0;
  uint64_t prefix_cache_hit_tokens_total = 0;
  uint64_t num_preemptions_total = 0;
  int32_t num_seqs_running = 0;  // sequences, not requests (a request's n all live in one group)
  int32_t num_seqs_waiting = 0;
};

struct EngineStats {
  int32_t num_requests_running = 0;  // requests with at least one sequence running
  int32_t num_requests_waiting = 0;  // the rest (queued, preempted, or not yet seen by the loop)
  // KV pages over all DP groups (one group without attention data parallelism).
  int32_t kv_pages_used = 0;         // held by live sequences
  int32_t kv_pages_cached = 0;       // held only by the prefix index (evictable)
  int32_t kv_pages_free = 0;
  int32_t kv_pages_total = 0;
  uint64_t prefix_cache_hit_tokens_total = 0;
  uint64_t prompt_tokens_total = 0;      // of admitted requests
  uint64_t generation_tokens_total = 0;
  uint64_t num_preemptions_total = 0;
  uint64_t num_steps_total = 0;
  uint64_t num_requests_finished_total = 0;
  bool draining = false;
  // Speculative decoding (empty / 0 without): spec_accept_length_counts[n] = verify steps that
  // committed n tokens (accepted drafts + the target's token), n = 1 .. num_draft_tokens.
  std::vector<uint64_t> spec_accept_length_counts;
  uint64_t spec_draft_tokens_total = 0;     // drafts verified
  uint64_t spec_accepted_tokens_total = 0;  // drafts accepted
  // Per attention data-parallel group, in group order, when the runner has more than one group;
  // empty otherwise.
  std::vector<DpGroupStats> dp_groups;
  // HiCache (Engine::enable_hicache); all zero / empty without.
  bool hicache_enabled = false;
  int32_t hicache_host_pages_used = 0;
  int32_t hicache_host_pages_total = 0;
  uint64_t hicache_host_hit_tokens_total = 0;  // tokens loaded back from the host tier
  uint64_t hicache_disk_hit_tokens_total = 0;  // tokens loaded back from the disk tier
  // Load-back durations: bucket upper bounds (seconds), per-bucket counts (not cumulative, one
  // more for +Inf), sum and count.
  std::vector<double> hicache_load_seconds_bounds;
  std::vector<uint64_t> hicache_load_seconds_counts;
  double hicache_load_seconds_sum = 0;
  uint64_t hicache_loads_total = 0;
};

class Engine {
 public:
  // Fails (invalid argument) when the config does not match the runner.
  static Result<std::unique_ptr<Engine>> create(EngineConfig config,
                                                std::unique_ptr<ModelRunner> runner);
  ~Engine();  // stops the thread; cancels what is left
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Turns on speculative decoding for every later request (except those asking for prompt logits),
  // before start(). Fails (invalid argument) for options the draft or the runner cannot honour:
  // the runner must capture hidden states (ModelFeatures::hidden_capture; with attention
  // data-parallel groups, every group's, in slice order).
  Status enable_speculative(std::unique_ptr<DraftModel> draft, SpeculativeOptions options);
  bool speculative() const { return draft_ != nullptr; }
  // Tests: the per-page draft features behind prefix-cache hits of speculative requests, of
  // attention group `dp_group`'s pool (null without a draft or without a prefix cache).
  const DraftFeatureStore* draft_feature_store(int32_t dp_group = 0) const {
    return draft_features_.empty() ? nullptr
                                   : draft_features_[static_cast<size_t>(dp_group)].get();
  }

  // Turns on the host (and disk) tiers behind the prefix cache (--enable-hierarchical-cache;
  // kv/hicache.h), before start() and before any request. Fails (invalid argument) when the
  // runner cannot copy KV pages (ModelRunner::kv_page_copier() is null), with attention data
  // parallelism or without the prefix cache, and when the host memory or the disk directory
  // cannot be had.
  Status enable_hicache(const HiCacheOptions& options);
  bool hicache_enabled() const { return sched_->hicache() != nullptr; }

  // Starts the engine thread. Without it, call step() yourself (tests).
  void start();

  // Thread-safe. See the header comment for errors. The request is seen by the loop at its next
  // step. Dropping the handle before the `done` event cancels the request.
  Result<RequestHandle> submit(GenerateRequest request);
  // Thread-safe, idempotent. The loop frees the request's pages at its next step (and emits a
  // `done` event with finish reason kCancelled for unfinished sequences).
  void cancel(RequestId id);

  // Thread-safe snapshot, updated after every step.
  EngineStats stats() const;
  bool is_draining() const { return draining_.load(); }

  // SIGTERM: refuse new requests, let the admitted ones finish for up to `timeout`, cancel the
  // rest, stop the thread. Returns true if everything finished in time.
  bool drain(std::chrono::milliseconds timeout);

  // Synchronous drive (only when start() was not called): processes submissions and
  // cancellations, then runs one step if there is work. Returns false when idle.
  bool step();

  // Not ok once the runner failed for good (EngineConfig::on_failure); /health answers 503.
  Status failure() const;
  SamplingParams default_sampling_params() const;
  const EngineConfig& config() const { return config_; }
  int32_t vocab_size() const { return vocab_size_; }
  int32_t hidden_size() const { return hidden_size_; }
  // Whether submit() accepts GenerateRequest::prompt_embeddings: the runner takes input
  // embeddings. A speculative draft needs nothing more: its context is the target's captured
  // hidden states, which carry the injected rows' information, and its anchors are committed
  // tokens, never embedding rows.
  bool takes_prompt_embeddings() const { return runner_->features().input_embeddings; }
  // Read-only access for tests (only between step() calls, or with the thread stopped).
  const Scheduler& scheduler() const { return *sched_; }

 private:
  struct Sink;
  struct SeqCtx;
  struct ReqCtx;
  struct Inbox;

  Engine(EngineConfig config, std::unique_ptr<ModelRunner> runner);
  void loop();
  void drain_inbox();
  void admit(std::unique_ptr<ReqCtx> req);
  void cancel_request(RequestId id, FinishReason reason, const Status& error);
  bool run_step();  // false when nothing was planned
  void sample_and_emit(const StepPlan& plan, const LogitsOut& logits, const ModelOutput& model_out);
  // Speculative decoding (engine_speculative.cpp). Before planning: a proposal for every decoding
  // speculative sequence, handed to the scheduler.
  void propose_drafts();
  Status propose_for(ReqCtx* req, SeqCtx* seq, int64_t anchor_pos, int32_t anchor,
                     int32_t num_drafts);
  // Checks a proposal's tokens and makes it the sequence's (greedy: q one-hot at each token).
  Status set_proposal(SeqCtx* seq, int64_t anchor_pos, int32_t num_drafts,
                      std::vector<int32_t> tokens, bool greedy);
  // After the step: commits the captured hidden states of every computed position of a
  // speculative sequence, except verify slices (committed once accepted). Returns the requests
  // whose draft failed.
  std::vector<std::pair<RequestId, Status>> feed_draft_context(const StepPlan& plan,
                                                               const ModelOutput& out);
  Status append_draft_context(SeqCtx* seq, const ModelOutput& out, size_t slice, int64_t start_pos,
                              int32_t first_token, int32_t num_tokens);
  // A new or rolled-back draft context for a sequence whose next computed position is `pos`:
  // positions below it that the draft lacks (served from the prefix cache) are appended from the
  // feature store.
  Status rebuild_draft_context(SeqCtx* seq, int64_t pos);
  // After a step: the pages written by sequences that recorded no features (draft_features_).
  void invalidate_unrecorded_pages(const StepPlan& plan);
  // The accepted tokens of a verify slice (greedy, token-wise, block or simulated).
  std::vector<SampleResult> verify_slice(ReqCtx* req, SeqCtx* seq, const SeqSlice& slice,
                                         std::span<const float> logits, SamplerScratch* scratch,
                                         int32_t* num_accepted) const;
  static RngKey spec_key(const ReqCtx& req, const SeqCtx& seq, uint64_t kind, uint64_t slot);
  // Copies the rows of the slices in `prompt_rows` (non-null: a request that wants its prompt
  // logits) into those requests' prompt_logits by position.
  void keep_prompt_logits(const StepPlan& plan, const ModelStep& step, const ModelOutput& out,
                          std::span<ReqCtx* const> prompt_rows);
  // The random key of a sequence's next token (the same on the CPU sampler and a runner's).
  static RngKey sample_key(const ReqCtx& req, const SeqCtx& seq);
  // A step's output against its plan: row counts, and tokens only where sampling was asked.
  Status check_step_output(const StepPlan& plan,
                           std::span<const std::optional<DeviceSampling>> sampling,
                           const LogitsOut& out) const;
  void finish_seq(ReqCtx* req, SeqCtx* seq, FinishReason reason, SeqDelta* delta);
  // GenerateRequest::prompt_embeddings: checked at submit; the planned slices' share of them
  // handed to the model (ModelSlice::embeddings).
  Status check_prompt_embeddings(const GenerateRequest& request) const;
  void attach_prompt_embeddings(const StepPlan& plan, ModelStep& step) const;
  void emit(ReqCtx* req, std::vector<SeqDelta> deltas, const Status& error = Status::ok());
  void publish_stats();
  bool has_work() const;

  EngineConfig config_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Scheduler> sched_;
  // Declared after runner_: a draft may use the runner's weights and is destroyed first.
  std::unique_ptr<DraftModel> draft_;
  SpeculativeOptions spec_;
  std::vector<int32_t> draft_capture_layers_;
  // The draft's inputs of every page written by a speculative sequence, so that speculative
  // requests can be served from the prefix cache: one store per attention group, whose pool's
  // page ids it is indexed by (empty without a prefix cache).
  std::vector<std::unique_ptr<DraftFeatureStore>> draft_features_;
  DraftFeatureStore& features_of(const SequenceState& st) {
    return *draft_features_[static_cast<size_t>(st.dp_group)];
  }
  std::vector<uint64_t> spec_accept_length_counts_;
  uint64_t spec_draft_tokens_total_ = 0;
  uint64_t spec_accepted_tokens_total_ = 0;
  int32_t vocab_size_ = 0;
  int32_t hidden_size_ = 0;
  std::vector<int32_t> eos_ids_;

  std::unique_ptr<ThreadPool> sampler_pool_;  // null: sample on the engine thread
  std::shared_ptr<Inbox> inbox_;  // submit/cancel -> loop
  std::shared_ptr<Sink> sink_;    // handles cancel through it

  // Owned by the loop thread.
  std::unordered_map<RequestId, std::unique_ptr<ReqCtx>> requests_;
  std::unordered_map<SeqId, std::pair<ReqCtx*, SeqCtx*>> seq_owner_;
  SeqId next_seq_id_ = 0;
  uint64_t prompt_tokens_total_ = 0;
  uint64_t generation_tokens_total_ = 0;
  uint64_t finished_total_ = 0;

  mutable std::mutex stats_mu_;
  EngineStats stats_;

  // The runner's failure (ModelRunner::health()), set once by the loop thread.
  void fail_everything(const Status& why);
  // After a failure: fails the requests that arrived since (each step of the loop).
  void fail_new_requests();
  mutable std::mutex failure_mu_;
  Status failure_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> draining_{false};
  std::atomic<RequestId> next_request_id_{1};
  std::thread thread_;
  bool started_ = false;
};

}  // namespace m3
