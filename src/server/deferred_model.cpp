#include "server/deferred_model.h"

namespace m3::server {

namespace {

Status loading() {
  return Status(StatusCode::kUnavailable, "The model is still loading.");
}

// Forwarders that read the installed component through an atomic pointer (set once).
class DeferredBackend : public InferenceBackend {
 public:
  std::atomic<InferenceBackend*> inner{nullptr};
  bool ready() const override {
    auto* b = inner.load();
    return b && b->ready();
  }
  Status failure() const override {
    auto* b = inner.load();
    return b ? b->failure() : Status::ok();
  }
  int32_t context_length() const override {
    auto* b = inner.load();
    return b ? b->context_length() : 0;
  }
  int32_t max_queued_requests() const override {
    auto* b = inner.load();
    return b ? b->max_queued_requests() : 0;
  }
  std::optional<VisionPreprocessConfig> vision() const override {
    auto* b = inner.load();
    return b ? b->vision() : std::nullopt;
  }
  Result<uint64_t> submit(BackendRequest request, EventCallback on_event) override {
    auto* b = inner.load();
    if (!b) return loading();
    return b->submit(std::move(request), std::move(on_event));
  }
  void cancel(uint64_t id) override {
    if (auto* b = inner.load()) b->cancel(id);
  }
  BackendStats stats() const override {
    auto* b = inner.load();
    return b ? b->stats() : BackendStats{};
  }
};

class DeferredCodec : public TextCodec {
 public:
  std::atomic<const TextCodec*> inner{nullptr};
  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    auto* c = inner.load();
    if (!c) return loading();
    return c->encode(text);
  }
  Result<std::string> decode(const std::vector<int32_t>& ids, bool skip) const override {
    auto* c = inner.load();
    if (!c) return loading();
    return c->decode(ids, skip);
  }
  int32_t vocab_size() const override {
    auto* c = inner.load();
    return c ? c->vocab_size() : 0;
  }
  std::optional<int32_t> token_id(std::string_view token) const override {
    auto* c = inner.load();
    return c ? c->token_id(token) : std::nullopt;
  }
};

class DeferredRenderer : public ChatRenderer {
 public:
  std::atomic<const ChatRenderer*> inner{nullptr};
  Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             const nlohmann::ordered_json& kwargs, bool add_gen) const override {
    auto* r = inner.load();
    if (!r) return loading();
    return r->render(messages, tools, kwargs, add_gen);
  }
};

}  // namespace

DeferredModel::DeferredModel()
    : backend_(std::make_unique<DeferredBackend>()),
      codec_(std::make_unique<DeferredCodec>()),
      renderer_(std::make_unique<DeferredRenderer>()) {}

DeferredModel::~DeferredModel() = default;

void DeferredModel::install(ModelStack stack) {
  if (installed_.exchange(true)) return;
  stack_ = std::move(stack);
  static_cast<DeferredCodec*>(codec_.get())->inner.store(stack_.codec.get());
  static_cast<DeferredRenderer*>(renderer_.get())->inner.store(stack_.renderer.get());
  // The backend last: ready() turning true means everything is usable.
  static_cast<DeferredBackend*>(backend_.get())->inner.store(stack_.backend.get());
}

}  // namespace m3::server
