#include "server/fake/fake_backend.h"

#include <algorithm>

#include "server/media/media_policy.h"

namespace m3::server {

struct FakeBackend::Req {
  uint64_t id = 0;
  BackendRequest request;
  std::shared_ptr<EventCallback> on_event;
  std::vector<int32_t> output;  // scripted tokens (EOS at the end unless infinite)
  bool infinite = false;
  bool fail = false;
  int32_t tokens_per_step = 1;
  std::chrono::milliseconds step{2};
  size_t pos = 0;  // next output token
  int32_t generated = 0;
  int32_t cached = 0;
  bool first = true;
  Clock::time_point next_step;
  std::string pending;      // bytes not yet emitted (incomplete UTF-8, possible stop string)
  std::string text_so_far;  // emitted text, for stop strings spanning steps
};

namespace {

// Value of the last "KEY=value" in text (value up to whitespace), or "".
std::string directive(const std::string& text, const std::string& key) {
  size_t p = text.rfind(key + "=");
  if (p == std::string::npos) return "";
  size_t b = p + key.size() + 1;
  size_t e = b;
  while (e < text.size() && !std::isspace(static_cast<unsigned char>(text[e])) && text[e] != '[' &&
         text[e] != '"' && text[e] != '<')
    ++e;
  return text.substr(b, e - b);
}

// A directive's integer value clamped to [lo, hi], or `fallback` when it is not a decimal integer
// (the prompt is client text: a directive the fake cannot read is ignored, never a throw).
int32_t directive_int(const std::string& v, int32_t fallback, int32_t lo, int32_t hi) {
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos) {
    return fallback;
  }
  return std::clamp(static_cast<int32_t>(std::stol(v)), lo, hi);
}

size_t utf8_incomplete_tail(const std::string& s) {
  size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t need = (c & 0x80) == 0 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    return need > back ? back : 0;
  }
  return 0;
}

// A made-up distribution in which the generated token is the most likely (as greedy decoding
// picks it): logprob(token) = -ln 2, then the next byte ids at -ln 2 * (k + 1).
TokenLogprobs fake_logprobs(int32_t token, int32_t top) {
  const float ln2 = 0.69314718f;
  TokenLogprobs lp;
  lp.logprob = -ln2;
  for (int32_t k = 0; k < top; ++k) {
    int32_t id = k == 0 ? token : (token + k) % 256;
    lp.top.emplace_back(id, -ln2 * static_cast<float>(k + 1));
  }
  return lp;
}

}  // namespace

FakeBackend::FakeBackend(FakeBackendOptions options) : options_(options) {
  thread_ = std::thread([this] { loop(); });
}

FakeBackend::~FakeBackend() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool FakeBackend::ready() const {
  return Clock::now() - created_ >= options_.ready_after;
}

Result<uint64_t> FakeBackend::submit(BackendRequest request, EventCallback on_event) {
  if (request.prompt_tokens.empty()) return invalid_argument("the prompt is empty");
  for (int32_t t : request.prompt_tokens) {
    if (t < 0 || t >= codec_.vocab_size()) {
      return invalid_argument("prompt token id " + std::to_string(t) + " is out of range [0, " +
                              std::to_string(codec_.vocab_size()) + ")");
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_request_ = request;
  }
  auto r = std::make_unique<Req>();
  std::string prompt = codec_.decode(request.prompt_tokens, false).value();
  std::string b64 = directive(prompt, "FAKE_OUTPUT_B64");
  std::string text = "Hello from the fake backend.";
  if (!b64.empty()) {
    auto decoded = base64_decode(b64);
    if (!decoded) return invalid_argument("FAKE_OUTPUT_B64 is not valid base64");
    text = *decoded;
  }
  if (prompt.find("FAKE_ECHO_SEED") != std::string::npos) {
    const auto& seed = request.sampling.seed;
    text = "seed " + (seed ? std::to_string(*seed) : std::string("none"));
  }
  r->output = codec_.encode(text).value();
  r->infinite = prompt.find("FAKE_INFINITE") != std::string::npos;
  r->fail = prompt.find("FAKE_ERROR") != std::string::npos;
  if (!r->infinite) r->output.push_back(FakeCodec::kEos);
  r->tokens_per_step =
      directive_int(directive(prompt, "FAKE_TPS"), options_.tokens_per_step, 1, 1 << 20);
  r->step = std::chrono::milliseconds(
      directive_int(directive(prompt, "FAKE_STEP_MS"), options_.step_ms, 0, 600000));
  r->on_event = std::make_shared<EventCallback>(std::move(on_event));
  std::lock_guard lock(mu_);
  if (static_cast<int32_t>(waiting_.size()) >= options_.max_waiting) {
    return Status(StatusCode::kResourceExhausted, "the waiting queue is full (" +
                                                      std::to_string(options_.max_waiting) +
                                                      " requests); retry later");
  }
  // Fake prefix cache: whole 128-token pages shared with the previous prompt.
  size_t common = 0;
  while (common < last_prompt_.size() && common < request.prompt_tokens.size() &&
         last_prompt_[common] == request.prompt_tokens[common])
    ++common;
  r->cached = static_cast<int32_t>(common / 128 * 128);
  if (r->cached == static_cast<int32_t>(request.prompt_tokens.size())) r->cached -= 128;
  r->cached = std::max(0, r->cached);
  prefix_hits_ += r->cached;
  last_prompt_ = request.prompt_tokens;
  r->request = std::move(request);
  r->id = next_id_++;
  uint64_t id = r->id;
  waiting_.push_back(std::move(r));
  cv_.notify_all();
  return id;
}

void FakeBackend::cancel(uint64_t id) {
  {
    std::lock_guard lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

BackendRequest FakeBackend::last_request() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_request_;
}

BackendStats FakeBackend::stats() const {
  std::lock_guard lock(mu_);
  BackendStats s;
  s.num_requests_running = static_cast<int32_t>(running_.size());
  s.num_requests_waiting = static_cast<int32_t>(waiting_.size());
  for (const auto& [id, r] : running_) {
    s.kv_pages_used +=
        static_cast<int32_t>((r->request.prompt_tokens.size() + r->generated + 127) / 128);
  }
  s.kv_pages_total = options_.kv_pages_total;
  s.prefix_cache_hit_tokens_total = prefix_hits_;
  return s;
}

BackendEvent FakeBackend::step_request(Req& r, Clock::time_point now) {
  BackendEvent ev;
  ev.cached_tokens = r.cached;
  const auto& sp = r.request.sampling;
  int32_t budget = sp.max_tokens > 0 ? sp.max_tokens : INT32_MAX;
  std::string new_bytes;
  bool stop = false, length = false;
  for (int k = 0; k < r.tokens_per_step && !stop && !length; ++k) {
    int32_t tok;
    if (r.pos < r.output.size()) {
      tok = r.output[r.pos++];
    } else if (r.infinite) {
      tok = 'a' + static_cast<int32_t>(r.generated % 26);
    } else {
      break;
    }
    ev.tokens.push_back(tok);
    if (sp.logprobs) ev.logprobs.push_back(fake_logprobs(tok, sp.top_logprobs));
    ++r.generated;
    bool is_stop_id = std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) !=
                      sp.stop_token_ids.end();
    if ((tok == FakeCodec::kEos && !sp.ignore_eos) || is_stop_id) {
      stop = true;
      break;
    }
    if (!(r.request.skip_special_tokens && tok >= 256)) new_bytes += FakeCodec::piece(tok);
    if (r.generated >= budget) length = true;
  }
  // Text: hold incomplete UTF-8 and possible stop-string prefixes back; cut at a stop string.
  r.pending += new_bytes;
  std::string candidate = r.text_so_far + r.pending;
  size_t cut = std::string::npos;
  for (const auto& s : sp.stop) {
    size_t p = candidate.find(
        s, r.text_so_far.size() >= s.size() ? r.text_so_far.size() - s.size() + 1 : 0);
    if (p != std::string::npos && p < cut) cut = p;
  }
  if (cut != std::string::npos) {
    ev.text = candidate.substr(r.text_so_far.size(), cut - std::min(cut, r.text_so_far.size()));
    r.pending.clear();
    stop = true;
    length = false;
  } else {
    bool final = stop || length;
    size_t hold = 0;
    if (!final) {
      hold = utf8_incomplete_tail(r.pending);
      for (const auto& s : sp.stop) {
        for (size_t n = std::min(s.size() - 1, candidate.size()); n > hold; --n) {
          if (candidate.compare(candidate.size() - n, n, s, 0, n) == 0) {
            hold = std::max(hold, std::min(n, r.pending.size()));
            break;
          }
        }
      }
    }
    ev.text = r.pending.substr(0, r.pending.size() - hold);
    r.pending.erase(0, r.pending.size() - hold);
  }
  r.text_so_far += ev.text;
  if (r.fail && !r.first) {
    ev.done = true;
    ev.finish_reason = "error";
    ev.error = "scripted failure (FAKE_ERROR)";
  } else if (stop || length || (!r.infinite && r.pos >= r.output.size())) {
    ev.done = true;
    ev.finish_reason = stop ? "stop" : "length";
  }
  r.first = false;
  ev.time = now;
  r.next_step = now + r.step;
  return ev;
}

void FakeBackend::loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    auto now = Clock::now();
    // Events are delivered outside the lock, so a callback may call back into the backend.
    std::vector<std::pair<std::shared_ptr<EventCallback>, BackendEvent>> out;
    for (uint64_t id : cancels_) {  // cancellations take effect at this step
      std::unique_ptr<Req> r;
      if (auto it = running_.find(id); it != running_.end()) {
        r = std::move(it->second);
        running_.erase(it);
      } else {
        auto w = std::find_if(waiting_.begin(), waiting_.end(),
                              [id](const auto& q) { return q->id == id; });
        if (w != waiting_.end()) {
          r = std::move(*w);
          waiting_.erase(w);
        }
      }
      if (r) {
        cancelled_total_.fetch_add(1);
        BackendEvent ev;
        ev.done = true;
        ev.finish_reason = "abort";
        ev.cached_tokens = r->cached;
        out.emplace_back(r->on_event, std::move(ev));
      }
    }
    cancels_.clear();
    while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < options_.max_running) {
      auto r = std::move(waiting_.front());
      waiting_.pop_front();
      r->next_step = now;
      running_[r->id] = std::move(r);
    }
    auto next_wake = now + std::chrono::milliseconds(50);
    for (auto it = running_.begin(); it != running_.end();) {
      Req& r = *it->second;
      if (r.next_step <= now) {
        BackendEvent ev = step_request(r, now);
        bool done = ev.done;
        out.emplace_back(r.on_event, std::move(ev));
        if (done) {
          it = running_.erase(it);
          continue;
        }
      }
      next_wake = std::min(next_wake, r.next_step);
      ++it;
    }
    if (!out.empty()) {
      lock.unlock();
      for (auto& [cb, ev] : out) (*cb)(std::move(ev));
      lock.lock();
      continue;
    }
    // Wake for a waiting request only when it can run: with every running slot taken, a
    // non-empty queue made this loop spin on the lock and starve cancel() and submit().
    cv_.wait_until(lock, next_wake, [this] {
      return stop_ || !cancels_.empty() ||
             (!waiting_.empty() && static_cast<int32_t>(running_.size()) < options_.max_running);
    });
  }
}

}  // namespace m3::server
