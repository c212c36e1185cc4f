#include "serving/engine_backend.h"

#include <utility>

namespace m3::serving {

SamplingParams to_sampling_params(const server::SamplingOptions& o,
                                  const SamplingParams& defaults) {
  SamplingParams p = defaults;
  if (o.temperature) p.temperature = static_cast<float>(*o.temperature);
  if (o.top_p) p.top_p = static_cast<float>(*o.top_p);
  if (o.top_k) p.top_k = *o.top_k;
  if (o.min_p) p.min_p = static_cast<float>(*o.min_p);
  if (o.presence_penalty) p.presence_penalty = static_cast<float>(*o.presence_penalty);
  if (o.frequency_penalty) p.frequency_penalty = static_cast<float>(*o.frequency_penalty);
  if (o.repetition_penalty) p.repetition_penalty = static_cast<float>(*o.repetition_penalty);
  if (o.seed) p.seed = *o.seed;
  p.n = 1;  // the server submits n > 1 as n requests, one per choice
  // Raw logprobs of the model's output distribution, before temperature and the other logits
  // processors (vLLM's default logprobs mode): the sampler computes them (sample/sampler.h).
  p.logprobs = o.logprobs;
  p.top_logprobs = o.logprobs ? o.top_logprobs : 0;
  if (o.max_tokens > 0) p.max_tokens = o.max_tokens;
  p.min_tokens = o.min_tokens;
  p.ignore_eos = o.ignore_eos;
  p.stop = o.stop;
  p.stop_token_ids = o.stop_token_ids;
  p.logit_bias = o.logit_bias;
  return p;
}

server::BackendEvent to_backend_event(const RequestEvent& e, bool with_logprobs) {
  server::BackendEvent out;
  out.time = e.time;
  out.done = e.done;
  out.cached_tokens = e.usage.cached_tokens;
  out.spec_verify_ct = e.usage.spec_verify_steps;
  out.spec_draft_token_num = e.usage.spec_draft_tokens;
  out.spec_accept_token_num = e.usage.spec_accepted_tokens;
  for (const SeqDelta& d : e.seqs) {
    if (d.seq_index != 0) continue;
    for (const GeneratedToken& g : d.tokens) {
      out.tokens.push_back(g.token);
      if (!with_logprobs) continue;
      server::TokenLogprobs lp;
      lp.logprob = g.logprob;
      lp.top.reserve(g.top_logprobs.size());
      for (const TokenLogprob& t : g.top_logprobs) lp.top.emplace_back(t.token, t.logprob);
      out.logprobs.push_back(std::move(lp));
    }
    out.text += d.text;
    if (d.finish_reason) out.finish_reason = finish_reason_name(*d.finish_reason);
  }
  if (!e.error.is_ok()) {
    out.error = e.error.message();
    out.unavailable = e.error.code() == StatusCode::kUnavailable;
    if (out.done) out.finish_reason = "error";
  }
  if (out.done && out.finish_reason.empty()) out.finish_reason = "abort";
  if (!out.done) out.finish_reason.clear();
  return out;
}

struct EngineBackend::Entry {
  std::mutex mu;  // one deliverer at a time: events reach the callback in order
  RequestHandle handle;
  server::EventCallback on_event;
  bool logprobs = false;
  std::string tag;  // unique among live requests (the DetokenizerTails key)
  bool done = false;
};

EngineBackend::EngineBackend(std::unique_ptr<Engine> engine, int32_t context_length,
                             std::shared_ptr<void> keepalive,
                             std::shared_ptr<DetokenizerTails> tails)
    : keepalive_(std::move(keepalive)),
      engine_(std::move(engine)),
      context_length_(context_length),
      tails_(std::move(tails)) {
  engine_->start();
}

EngineBackend::~EngineBackend() {
  // The server is gone by now: no more callbacks. Dropping the handles cancels what is left; the
  // engine's destructor then stops its thread.
  closing_.store(true);
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live.swap(live_);
  }
  for (auto& [id, entry] : live) {
    std::lock_guard<std::mutex> lock(entry->mu);
    entry->handle.cancel();
  }
  engine_.reset();
}

void EngineBackend::enable_vision(server::VisionPreprocessConfig preprocess, ImageEncoder encoder) {
  vision_ = preprocess;
  encoder_ = std::move(encoder);
}

Result<std::vector<PromptEmbeddings>> EngineBackend::encode_images(
    const server::BackendRequest& request) {
  std::vector<PromptEmbeddings> out;
  if (request.images.empty()) return out;
  if (!encoder_) {
    return Status(StatusCode::kUnimplemented, "this model has no vision tower; send text only");
  }
  constexpr size_t kRecent = 8;
  std::lock_guard<std::mutex> lock(encode_mu_);
  for (const auto& image : request.images) {
    std::shared_ptr<const std::vector<float>> features;
    for (const auto& [hash, f] : recent_features_) {
      if (hash == image->content_hash) features = f;
    }
    if (!features) {
      auto encoded = encoder_(*image);
      if (!encoded.is_ok()) return encoded.status();
      features = std::make_shared<const std::vector<float>>(std::move(encoded).value());
      recent_features_.emplace_back(image->content_hash, features);
      if (recent_features_.size() > kRecent) recent_features_.pop_front();
    }
    PromptEmbeddings e;
    e.token_offset = image->token_offset;
    e.num_tokens = image->num_tokens;
    e.values = std::move(features);
    e.content_hash = image->content_hash;
    out.push_back(std::move(e));
  }
  return out;
}

Result<uint64_t> EngineBackend::submit(server::BackendRequest request,
                                       server::EventCallback on_event) {
  const bool logprobs = request.sampling.logprobs;
  auto embeddings = encode_images(request);
  if (!embeddings.is_ok()) return embeddings.status();
  GenerateRequest g;
  g.prompt_embeddings = std::move(embeddings).value();
  g.prompt_tokens = std::move(request.prompt_tokens);
  g.params = to_sampling_params(request.sampling, engine_->default_sampling_params());
  g.skip_special_tokens = request.skip_special_tokens;
  // The OpenAI id plus a counter: unique, so the detokenizer registry has one entry per request.
  g.tag = std::move(request.request_id) + "#" + std::to_string(next_tag_.fetch_add(1));
  const std::string tag = g.tag;
  auto handle = engine_->submit(std::move(g));
  if (!handle.is_ok()) {
    if (tails_) tails_->drop(tag);
    if (handle.status().code() == StatusCode::kResourceExhausted && engine_->is_draining()) {
      return unavailable("the server is shutting down: " + handle.status().message());
    }
    return handle.status();
  }
  auto entry = std::make_shared<Entry>();
  const uint64_t id = handle->id();
  entry->handle = std::move(handle).value();
  entry->on_event = std::move(on_event);
  entry->logprobs = logprobs;
  entry->tag = tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_[id] = entry;
  }
  // The stream must not own the entry (the entry owns the stream through the handle).
  std::weak_ptr<Entry> weak = entry;
  entry->handle.stream().set_notify([this, weak] {
    if (auto e = weak.lock()) deliver(e);
  });
  return id;
}

void EngineBackend::deliver(const std::shared_ptr<Entry>& entry) {
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(entry->mu);
    if (entry->done) return;
    while (auto ev = entry->handle.stream().try_next()) {
      server::BackendEvent be = to_backend_event(*ev, entry->logprobs);
      const bool done = be.done;
      if (done && tails_) {
        // The detokenizer's incomplete UTF-8 tail, unless a stop string cut the text (what
        // followed the match is dropped) or the request failed.
        bool stopped_by_string = false;
        for (const SeqDelta& d : ev->seqs) stopped_by_string |= !d.stop_string.empty();
        std::string tail = tails_->flush(entry->tag);
        if (!stopped_by_string && be.finish_reason != "error") be.text += tail;
      }
      if (!closing_.load()) entry->on_event(std::move(be));
      if (done) {
        entry->done = true;
        finished = true;
        break;
      }
    }
  }
  if (finished) {
    // The caller's shared_ptr keeps the entry (and its stream) alive until deliver() returns.
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(entry->handle.id());
  }
}

void EngineBackend::cancel(uint64_t id) {
  engine_->cancel(id);
}

server::BackendStats EngineBackend::stats() const {
  const EngineStats s = engine_->stats();
  server::BackendStats out;
  out.num_requests_running = s.num_requests_running;
  out.num_requests_waiting = s.num_requests_waiting;
  out.kv_pages_used = s.kv_pages_used;
  out.kv_pages_cached = s.kv_pages_cached;
  out.kv_pages_total = s.kv_pages_total;
  out.prefix_cache_hit_tokens_total = s.prefix_cache_hit_tokens_total;
  out.num_preemptions_total = s.num_preemptions_total;
  out.spec_accept_length_counts = s.spec_accept_length_counts;
  out.spec_draft_tokens_total = s.spec_draft_tokens_total;
  out.spec_accepted_tokens_total = s.spec_accepted_tokens_total;
  out.hicache_enabled = s.hicache_enabled;
  out.hicache_host_pages_used = s.hicache_host_pages_used;
  out.hicache_host_hit_tokens_total = s.hicache_host_hit_tokens_total;
  out.hicache_disk_hit_tokens_total = s.hicache_disk_hit_tokens_total;
  out.hicache_load_seconds_bounds = s.hicache_load_seconds_bounds;
  out.hicache_load_seconds_counts = s.hicache_load_seconds_counts;
  out.hicache_load_seconds_sum = s.hicache_load_seconds_sum;
  for (const DpGroupStats& g : s.dp_groups) {
    server::DpRankKvStats& r = out.dp_ranks.emplace_back();
    r.kv_pages_used = g.kv_pages_used;
    r.kv_pages_cached = g.kv_pages_cached;
    r.kv_pages_total = g.kv_pages_total;
    r.prefix_cache_hit_tokens_total = g.prefix_cache_hit_tokens_total;
    r.num_preemptions_total = g.num_preemptions_total;
  }
  return out;
}

}  // namespace m3::serving
