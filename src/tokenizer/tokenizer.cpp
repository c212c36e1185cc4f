#include "tokenizer/tokenizer.h"

#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json_depth.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace m3 {
namespace tok {

using json = nlohmann::json;

struct TokenizerImpl {
  std::unique_ptr<Normalizer> normalizer;
  PreTokenizerChain pre;
  BpeModel model;
  PostProcessor post;
  DecoderSpec decoder;
  AddedVocab added;
  TokenizerConfig config;
  std::vector<const std::string*> id_str;  // decode string per id (nullptr: unknown id)
  std::vector<uint8_t> id_special;

  const std::string* token_string(int32_t id, bool skip_special) const {
    if (id < 0 || static_cast<size_t>(id) >= id_str.size()) return nullptr;
    if (skip_special && id_special[id]) return nullptr;
    return id_str[id];
  }

  void encode_text(std::string_view text, bool at_origin, std::vector<int32_t>& ids) const {
    std::vector<Piece> pieces{Piece{text, at_origin}};
    std::deque<std::string> arena;
    pre.run(pieces, arena);
    for (const Piece& p : pieces) model.tokenize(p.text, ids);
  }

  void encode_segment(std::string_view seg, bool at_origin, std::vector<int32_t>& ids) const {
    std::string normalized;
    if (normalizer) {
      normalized.assign(seg);
      normalizer->normalize(normalized);
      seg = normalized;
    }
    if (seg.empty()) return;
    if (!added.has_normalized()) {
      encode_text(seg, at_origin, ids);
      return;
    }
    std::vector<AddedSplit> splits;
    added.find_matches(seg, /*normalized=*/true, splits);
    for (const AddedSplit& s : splits) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else if (s.end > s.start) {
        encode_text(seg.substr(s.start, s.end - s.start), at_origin && s.start == 0, ids);
      }
    }
  }
};

namespace {

std::string config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return {};
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return {};
}

Result<std::string> read_file(const std::string& path, bool required, bool* found) {
  std::ifstream f(path, std::ios::binary);
  *found = static_cast<bool>(f);
  if (!f) {
    if (required) return not_found("cannot open " + path);
    return std::string();
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace
}  // namespace tok

using tok::json;

Result<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  bool found = false;
  M3_ASSIGN_OR_RETURN(std::string tj, tok::read_file(model_dir + "/tokenizer.json", true, &found));
  M3_ASSIGN_OR_RETURN(std::string cj,
                      tok::read_file(model_dir + "/tokenizer_config.json", false, &found));
  return from_strings(tj, cj, model_dir + "/tokenizer.json");
}

Result<Tokenizer> Tokenizer::from_strings(std::string_view tokenizer_json,
                                          std::string_view config_json,
                                          const std::string& source) {
  if (json_too_deep(tokenizer_json) || json_too_deep(config_json)) {
    return invalid_argument(source + ": JSON nested more than " + std::to_string(kMaxJsonDepth) +
                            " levels deep");
  }
  json j = json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument(source + ": not a JSON object");
  }
  json cfg = json::object();
  if (!config_json.empty()) {
    cfg = json::parse(config_json.begin(), config_json.end(), nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return invalid_argument(source + ": tokenizer_config.json is not a JSON object");
    }
  }
  auto fail = [&](const Status& s) {
    return Status(s.code(), source + ": " + s.message());
  };
  try {
    auto impl = std::make_shared<tok::TokenizerImpl>();
    const json& model = j.value("model", json());
    if (!model.is_object()) return invalid_argument(source + ": no 'model' object");
    std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") {
      return unimplemented(source + ": model type '" + type + "' is not supported (BPE only)");
    }
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      auto n = tok::make_normalizer(j["normalizer"]);
      if (!n.is_ok()) return fail(n.status());
      impl->normalizer = std::move(n).value();
    }
    auto pre = tok::make_pre_tokenizer_chain(j.value("pre_tokenizer", json()));
    if (!pre.is_ok()) return fail(pre.status());
    impl->pre = std::move(pre).value();
    auto bpe = tok::BpeModel::from_json(model, impl->pre.byte_level_tail);
    if (!bpe.is_ok()) return fail(bpe.status());
    impl->model = std::move(bpe).value();
    auto post = tok::PostProcessor::from_json(j.value("post_processor", json()));
    if (!post.is_ok()) return fail(post.status());
    impl->post = std::move(post).value();
    auto dec = tok::DecoderSpec::from_json(j.value("decoder", json()));
    if (!dec.is_ok()) return fail(dec.status());
    impl->decoder = std::move(dec).value();

    // Added tokens, as HF's AddedVocabulary::add_tokens: an existing id (added or model) is
    // reused, otherwise ids continue after the model vocab.
    int32_t next_id = static_cast<int32_t>(impl->model.vocab_count());
    const json added = j.value("added_tokens", json::array());
    for (size_t i = 0; i < added.size(); ++i) {
      const json& a = added[i];
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string()) {
        return invalid_argument(source + ": added_tokens[" + std::to_string(i) +
                                "] has no 'content'");
      }
      tok::AddedToken t;
      t.content = a["content"].get<std::string>();
      if (t.content.empty()) continue;
      t.special = a.value("special", false);
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.normalized = a.value("normalized", !t.special);
      if (const tok::AddedToken* prev = impl->added.by_content(t.content)) {
        t.id = prev->id;
      } else if (auto mid = impl->model.token_to_id(t.content)) {
        t.id = *mid;
      } else {
        t.id = next_id++;
      }
      std::string pattern = t.content;
      if (t.normalized && impl->normalizer) impl->normalizer->normalize(pattern);
      impl->added.add(t, pattern);
    }
    impl->added.build();

    // Decode strings and special flags per id.
    int32_t max_id = impl->model.max_id();
    for (const tok::AddedToken& t : impl->added.tokens()) max_id = std::max(max_id, t.id);
    impl->id_str.assign(static_cast<size_t>(max_id + 1), nullptr);
    impl->id_special.assign(static_cast<size_t>(max_id + 1), 0);
    for (int32_t id = 0; id <= max_id; ++id) {
      const std::string* s = impl->added.decode_string(id);
      if (!s) s = impl->model.id_to_token(id);
      impl->id_str[id] = s;
      impl->id_special[id] = s && impl->added.is_special_content(*s);
    }

    // tokenizer_config.json
    TokenizerConfig& c = impl->config;
    c.bos_token = tok::config_token(cfg, "bos_token");
    c.eos_token = tok::config_token(cfg, "eos_token");
    c.pad_token = tok::config_token(cfg, "pad_token");
    c.unk_token = tok::config_token(cfg, "unk_token");
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) {
      c.add_bos_token = cfg["add_bos_token"].get<bool>();
    }
    if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) {
      c.add_eos_token = cfg["add_eos_token"].get<bool>();
    }
    if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
      c.chat_template = cfg["chat_template"].get<std::string>();
    }
    Tokenizer t;
    t.impl_ = impl;
    auto lookup = [&](const std::string& s) { return s.empty() ? -1 : t.token_to_id(s).value_or(-1); };
    impl->config.bos_id = lookup(c.bos_token);
    impl->config.eos_id = lookup(c.eos_token);
    impl->config.pad_id = lookup(c.pad_token);
    impl->config.unk_id = lookup(c.unk_token);
    return t;
  } catch (const json::exception& e) {
    return invalid_argument(source + ": unexpected JSON structure (" + e.what() + ")");
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const tok::TokenizerImpl& im = *impl_;
  std::string sanitized;
  if (!tok::utf8_is_valid(text)) {
    sanitized = tok::utf8_sanitize(text);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (!im.added.has_raw()) {
    if (!text.empty()) im.encode_segment(text, true, ids);
  } else {
    std::vector<tok::AddedSplit> splits;
    im.added.find_matches(text, /*normalized=*/false, splits);
    for (const tok::AddedSplit& s : splits) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else if (s.end > s.start) {
        im.encode_segment(text.substr(s.start, s.end - s.start), s.start == 0, ids);
      }
    }
  }
  return im.post.apply(std::move(ids), add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  tok::DecodeStream stream(&impl_->decoder);
  std::string out;
  for (int32_t id : ids) {
    if (const std::string* s = impl_->token_string(id, skip_special_tokens)) stream.push(*s, out);
  }
  stream.finish(out);
  return out;
}

std::string Tokenizer::decode_reference(std::span<const int32_t> ids,
                                        bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    if (const std::string* s = impl_->token_string(id, skip_special_tokens)) tokens.push_back(*s);
  }
  return impl_->decoder.apply_batch(std::move(tokens));
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const tok::AddedToken* t = impl_->added.by_content(token)) return t->id;
  return impl_->model.token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* s = impl_->token_string(id, false);
  return s ? *s : std::string();
}

size_t Tokenizer::vocab_size() const { return impl_->id_str.size(); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_special.size() && impl_->id_special[id];
}

const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : impl_(tokenizer.impl_), skip_special_(skip_special_tokens),
      stream_(std::make_unique<tok::DecodeStream>(&impl_->decoder)) {}

IncrementalDetokenizer::~IncrementalDetokenizer() = default;
IncrementalDetokenizer::IncrementalDetokenizer(IncrementalDetokenizer&&) noexcept = default;
IncrementalDetokenizer& IncrementalDetokenizer::operator=(IncrementalDetokenizer&&) noexcept =
    default;

std::string IncrementalDetokenizer::feed(int32_t id) {
  std::string out;
  if (const std::string* s = impl_->token_string(id, skip_special_)) stream_->push(*s, out);
  return out;
}

std::string IncrementalDetokenizer::feed(std::span<const int32_t> ids) {
  std::string out;
  for (int32_t id : ids) {
    if (const std::string* s = impl_->token_string(id, skip_special_)) stream_->push(*s, out);
  }
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  stream_->finish(out);
  stream_ = std::make_unique<tok::DecodeStream>(&impl_->decoder);
  return out;
}

}  // namespace m3
