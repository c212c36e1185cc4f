#include "model/step_wire.h"

#include <cstring>
#include <string>
#include <type_traits>

namespace m3 {

namespace {

constexpr uint32_t kMagic = 0x5453334d;  // "M3ST"
constexpr uint32_t kVersion = 2;  // 2: ModelSlice::dp_group

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put_array(const T* data, size_t n) {
    put<uint64_t>(n);
    const char* p = reinterpret_cast<const char*>(data);
    out.insert(out.end(), p, p + n * sizeof(T));
  }
  std::vector<char> out;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  Status get(T* v, const char* what) {
    if (size_ - pos_ < sizeof(T)) return truncated(what);
    std::memcpy(v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }
  template <typename T>
  Status get_array(std::vector<T>* v, const char* what) {
    uint64_t n = 0;
    M3_RETURN_IF_ERROR(get(&n, what));
    if (n > (size_ - pos_) / sizeof(T)) return truncated(what);
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), data_ + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return Status::ok();
  }
  size_t left() const { return size_ - pos_; }

 private:
  Status truncated(const char* what) const {
    return invalid_argument(std::string("[model.step_wire] the step's bytes end inside ") + what +
                            " (at byte " + std::to_string(pos_) + " of " +
                            std::to_string(size_) + ")");
  }
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<char> encode_step(const ModelStep& step) {
  Writer w;
  w.put(kMagic);
  w.put(kVersion);
  w.put_array(step.capture_layers.data(), step.capture_layers.size());
  w.put<uint64_t>(step.slices.size());
  for (const ModelSlice& s : step.slices) {
    w.put_array(s.tokens.data(), s.tokens.size());
    w.put<int64_t>(s.start_pos);
    w.put<int32_t>(s.dp_group);
    w.put_array(s.block_table.data(), s.block_table.size());
    w.put_array(s.logits_rows.data(), s.logits_rows.size());
    w.put<uint8_t>(s.sample.has_value() ? 1 : 0);
    if (s.sample) {
      const DeviceSampling& d = *s.sample;
      w.put(d.temperature);
      w.put(d.top_k);
      w.put(d.top_p);
      w.put(d.min_p);
      w.put(d.rng.seed);
      w.put(d.rng.stream);
      w.put(d.rng.counter);
    }
    w.put<uint64_t>(s.embeddings.size());
    for (const InputEmbedding& e : s.embeddings) {
      w.put(e.token_index);
      w.put_array(e.values.data(), e.values.size());
    }
  }
  return std::move(w.out);
}

Result<WireStep> decode_step(const char* data, size_t size) {
  Reader r(data, size);
  uint32_t magic = 0, version = 0;
  M3_RETURN_IF_ERROR(r.get(&magic, "the header"));
  M3_RETURN_IF_ERROR(r.get(&version, "the header"));
  if (magic != kMagic || version != kVersion) {
    return invalid_argument("[model.step_wire] not a step of this build (magic " +
                            std::to_string(magic) + ", version " + std::to_string(version) +
                            "; expected " + std::to_string(kMagic) + ", " +
                            std::to_string(kVersion) + ")");
  }
  WireStep out;
  M3_RETURN_IF_ERROR(r.get_array(&out.step.capture_layers, "the captured layers"));
  uint64_t slices = 0;
  M3_RETURN_IF_ERROR(r.get(&slices, "the slice count"));
  // Each slice takes at least 45 bytes (five counts and start_pos of 8, dp_group of 4, the
  // sampling flag); a count beyond that is corrupt, not a reason to allocate.
  if (slices > r.left() / 45) {
    return invalid_argument("[model.step_wire] " + std::to_string(slices) +
                            " slices cannot fit in the " + std::to_string(r.left()) +
                            " bytes left");
  }
  out.tokens.resize(slices);
  out.block_tables.resize(slices);
  out.step.slices.resize(slices);
  std::vector<std::vector<std::vector<float>>> embeddings(slices);
  for (size_t i = 0; i < slices; ++i) {
    ModelSlice& s = out.step.slices[i];
    M3_RETURN_IF_ERROR(r.get_array(&out.tokens[i], "a slice's tokens"));
    M3_RETURN_IF_ERROR(r.get(&s.start_pos, "a slice's start position"));
    M3_RETURN_IF_ERROR(r.get(&s.dp_group, "a slice's attention group"));
    M3_RETURN_IF_ERROR(r.get_array(&out.block_tables[i], "a slice's block table"));
    M3_RETURN_IF_ERROR(r.get_array(&s.logits_rows, "a slice's logits rows"));
    uint8_t has_sample = 0;
    M3_RETURN_IF_ERROR(r.get(&has_sample, "a slice's sampling flag"));
    if (has_sample > 1) return invalid_argument("[model.step_wire] corrupt sampling flag");
    if (has_sample) {
      DeviceSampling d;
      M3_RETURN_IF_ERROR(r.get(&d.temperature, "a slice's sampling"));
      M3_RETURN_IF_ERROR(r.get(&d.top_k, "a slice's sampling"));
      M3_RETURN_IF_ERROR(r.get(&d.top_p, "a slice's sampling"));
      M3_RETURN_IF_ERROR(r.get(&d.min_p, "a slice's sampling"));
      M3_RETURN_IF_ERROR(r.get(&d.rng.seed, "a slice's sampling"));
      M3_RETURN_IF_ERROR(r.get(&d.rng.stream, "a slice's sampling"));
      M3_RETURN_IF_ERROR(r.get(&d.rng.counter, "a slice's sampling"));
      s.sample = d;
    }
    uint64_t n_embed = 0;
    M3_RETURN_IF_ERROR(r.get(&n_embed, "a slice's embedding count"));
    if (n_embed > r.left() / 12) {
      return invalid_argument("[model.step_wire] " + std::to_string(n_embed) +
                              " embeddings cannot fit in the bytes left");
    }
    s.embeddings.resize(n_embed);
    for (size_t e = 0; e < n_embed; ++e) {
      M3_RETURN_IF_ERROR(r.get(&s.embeddings[e].token_index, "an embedding"));
      out.embedding_values.emplace_back();
      M3_RETURN_IF_ERROR(r.get_array(&out.embedding_values.back(), "an embedding's values"));
    }
  }
  if (r.left() != 0) {
    return invalid_argument("[model.step_wire] " + std::to_string(r.left()) +
                            " bytes after the step");
  }
  // The spans, now that no vector grows any more.
  size_t next_embedding = 0;
  for (size_t i = 0; i < slices; ++i) {
    ModelSlice& s = out.step.slices[i];
    s.tokens = out.tokens[i];
    s.block_table = out.block_tables[i];
    for (InputEmbedding& e : s.embeddings) e.values = out.embedding_values[next_embedding++];
  }
  return out;
}

}  // namespace m3
