#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "tokenizer/pre_tokenizer.h"

namespace m3::tok {
namespace {

using json = nlohmann::json;
using Kind = DecoderStep::Kind;

// HF ByteLevel decoder, one token: its bytes through the byte-to-unicode table when every
// character is in it, else the token's own UTF-8.
void byte_level_bytes(std::string_view tok, std::string& out) {
  size_t mark = out.size();
  for (size_t i = 0; i < tok.size();) {
    char32_t cp;
    i += utf8_decode_valid(tok.data() + i, &cp);
    int b = char_byte(cp);
    if (b < 0) {
      out.resize(mark);
      out.append(tok);
      return;
    }
    out.push_back(static_cast<char>(b));
  }
}

// <0xHH> -> byte value, or -1.
int byte_token_value(std::string_view tok) {
  if (tok.size() != 6 || tok.substr(0, 3) != "<0x" || tok[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(tok[3]), lo = hex(tok[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string metaspace_token(const DecoderStep& s, std::string_view tok, bool first) {
  std::string out;
  out.reserve(tok.size());
  for (size_t i = 0; i < tok.size();) {
    char32_t cp;
    size_t len = utf8_decode_valid(tok.data() + i, &cp);
    if (cp == s.rep_cp) {
      if (!(first && s.prepend)) out.push_back(' ');
    } else {
      out.append(tok, i, len);
    }
    i += len;
  }
  return out;
}

std::string strip_token(const DecoderStep& s, std::string_view tok) {
  std::vector<std::pair<size_t, size_t>> chars;  // (offset, length)
  std::vector<char32_t> cps;
  for (size_t i = 0; i < tok.size();) {
    char32_t cp;
    size_t len = utf8_decode_valid(tok.data() + i, &cp);
    chars.push_back({i, len});
    cps.push_back(cp);
    i += len;
  }
  size_t start_cut = 0;
  for (size_t i = 0; i < cps.size() && i < s.strip_start; ++i) {
    if (cps[i] != s.strip_content) break;
    start_cut = i + 1;
  }
  size_t stop_cut = cps.size();
  for (size_t i = 0; i < s.strip_stop && i < cps.size(); ++i) {
    size_t index = cps.size() - i - 1;
    if (cps[index] != s.strip_content) break;
    stop_cut = index;
  }
  if (start_cut >= stop_cut) return std::string();  // HF panics when the cuts cross
  size_t b = chars[start_cut].first;
  size_t e = stop_cut == cps.size() ? tok.size() : chars[stop_cut].first;
  return std::string(tok.substr(b, e - b));
}

std::string replace_token(const DecoderStep& s, std::string_view tok) {
  std::vector<Span> m;
  s.re->find_all(tok, m);
  std::string out;
  size_t prev = 0;
  for (const Span& sp : m) {
    out.append(tok.substr(prev, sp.start - prev));
    out.append(s.content);
    prev = sp.end;
  }
  out.append(tok.substr(prev));
  return out;
}

void flush_fallback(std::string& bytes, std::vector<std::string>& out) {
  if (bytes.empty()) return;
  if (utf8_is_valid(bytes)) {
    out.push_back(bytes);
  } else {
    for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back(kReplacementUtf8);
  }
  bytes.clear();
}

Status flatten(const json& j, std::vector<const json*>& flat) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return invalid_argument("tokenizer.json: decoder without a 'type'");
  }
  if (j["type"] == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) {
      return invalid_argument("tokenizer.json: decoder Sequence without 'decoders'");
    }
    for (const json& sub : j["decoders"]) M3_RETURN_IF_ERROR(flatten(sub, flat));
  } else {
    flat.push_back(&j);
  }
  return Status::ok();
}

}  // namespace

Result<DecoderSpec> DecoderSpec::from_json(const json& j) {
  DecoderSpec spec;
  if (j.is_null()) return spec;
  spec.none_ = false;
  std::vector<const json*> flat;
  M3_RETURN_IF_ERROR(flatten(j, flat));
  for (const json* d : flat) {
    const std::string type = (*d)["type"].get<std::string>();
    DecoderStep s{};
    if (type == "ByteLevel") {
      s.kind = Kind::kByteLevel;
    } else if (type == "Fuse") {
      s.kind = Kind::kFuse;
    } else if (type == "ByteFallback") {
      s.kind = Kind::kByteFallback;
    } else if (type == "Metaspace") {
      s.kind = Kind::kMetaspace;
      s.rep = d->value("replacement", std::string("\xE2\x96\x81"));
      if (s.rep.empty()) return invalid_argument("decoder Metaspace: empty replacement");
      utf8_decode_valid(s.rep.data(), &s.rep_cp);
      std::string scheme = d->value("prepend_scheme", std::string("always"));
      s.prepend = scheme != "never";
      if (d->contains("add_prefix_space") && (*d)["add_prefix_space"].is_boolean() &&
          !(*d)["add_prefix_space"].get<bool>()) {
        s.prepend = false;
      }
    } else if (type == "Strip") {
      s.kind = Kind::kStrip;
      std::string c = d->value("content", std::string(" "));
      if (c.empty()) return invalid_argument("decoder Strip: empty content");
      utf8_decode_valid(c.data(), &s.strip_content);
      s.strip_start = d->value("start", size_t{0});
      s.strip_stop = d->value("stop", size_t{0});
    } else if (type == "Replace") {
      s.kind = Kind::kReplace;
      const json p = d->value("pattern", json());
      M3_ASSIGN_OR_RETURN(Regex re, pattern_from_json(p, "decoder Replace"));
      s.re = std::make_shared<Regex>(std::move(re));
      if (p.contains("String")) {
        s.is_literal = true;
        s.literal = p["String"].get<std::string>();
      }
      s.content = d->value("content", std::string());
    } else {
      return unimplemented("tokenizer.json: decoder type '" + type + "' is not supported");
    }
    spec.steps_.push_back(std::move(s));
  }
  spec.fuse_ = spec.steps_.size();
  for (size_t k = 0; k < spec.steps_.size(); ++k) {
    if (spec.steps_[k].kind == Kind::kFuse || spec.steps_[k].kind == Kind::kByteLevel) {
      spec.fuse_ = k;
      break;
    }
  }
  for (size_t k = spec.fuse_ + 1; k < spec.steps_.size(); ++k) {
    const DecoderStep& s = spec.steps_[k];
    bool ok = s.kind == Kind::kFuse || s.kind == Kind::kMetaspace || s.kind == Kind::kStrip ||
              (s.kind == Kind::kReplace && s.is_literal && !s.literal.empty());
    if (!ok) spec.streamable_ = false;
  }
  return spec;
}

std::string DecoderSpec::apply_batch(std::vector<std::string> tokens) const {
  if (none_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  for (const DecoderStep& s : steps_) {
    std::vector<std::string> next;
    switch (s.kind) {
      case Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) byte_level_bytes(t, bytes);
        next.push_back(utf8_sanitize(bytes));
        break;
      }
      case Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case Kind::kByteFallback: {
        std::string pending;
        for (const std::string& t : tokens) {
          int b = byte_token_value(t);
          if (b >= 0) {
            pending.push_back(static_cast<char>(b));
          } else {
            flush_fallback(pending, next);
            next.push_back(t);
          }
        }
        flush_fallback(pending, next);
        break;
      }
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) next.push_back(metaspace_token(s, tokens[i], i == 0));
        break;
      case Kind::kStrip:
        for (const std::string& t : tokens) next.push_back(strip_token(s, t));
        break;
      case Kind::kReplace:
        for (const std::string& t : tokens) next.push_back(replace_token(s, t));
        break;
    }
    tokens.swap(next);
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

DecodeStream::DecodeStream(const DecoderSpec* spec) : spec_(spec) {
  size_t n = spec->steps().size();
  count_.assign(n, 0);
  bytes_.assign(n, std::string());
  strip_seen_.assign(n, 0);
  strip_started_.assign(n, false);
  held_.assign(n, std::string());
}

void DecodeStream::push(std::string_view token, std::string& out) {
  if (spec_->none()) {
    if (!first_token_) out.push_back(' ');
    first_token_ = false;
    out.append(token);
    return;
  }
  if (!spec_->streamable()) {
    buffered_.emplace_back(token);
    return;
  }
  feed_token(0, token, out);
}

void DecodeStream::finish(std::string& out) {
  if (spec_->none()) return;
  if (!spec_->streamable()) {
    out += spec_->apply_batch(std::move(buffered_));
    buffered_.clear();
    return;
  }
  const size_t fuse = spec_->fuse_index();
  for (size_t k = 0; k < fuse; ++k) flush_token_step(k, out);
  if (fuse < spec_->steps().size()) {
    if (spec_->steps()[fuse].kind == Kind::kByteLevel) {
      std::string tail;
      lossy_.finish(tail);
      if (!tail.empty()) feed_text(fuse + 1, tail, out);
    }
    finish_text(fuse + 1, out);
  }
}

void DecodeStream::feed_token(size_t k, std::string_view tok, std::string& out) {
  const auto& steps = spec_->steps();
  const size_t fuse = spec_->fuse_index();
  if (k == fuse) {
    if (k == steps.size()) {
      out.append(tok);  // no fusing step: the tokens are joined with ""
    } else if (steps[k].kind == Kind::kByteLevel) {
      std::string bytes, text;
      byte_level_bytes(tok, bytes);
      lossy_.push(bytes, text);
      if (!text.empty()) feed_text(k + 1, text, out);
    } else {
      if (!tok.empty()) feed_text(k + 1, tok, out);
    }
    return;
  }
  const DecoderStep& s = steps[k];
  const uint64_t index = count_[k]++;
  switch (s.kind) {
    case Kind::kMetaspace:
      feed_token(k + 1, metaspace_token(s, tok, index == 0), out);
      return;
    case Kind::kStrip:
      feed_token(k + 1, strip_token(s, tok), out);
      return;
    case Kind::kReplace:
      feed_token(k + 1, replace_token(s, tok), out);
      return;
    case Kind::kByteFallback: {
      int b = byte_token_value(tok);
      if (b >= 0) {
        bytes_[k].push_back(static_cast<char>(b));
        return;
      }
      flush_token_step(k, out);
      feed_token(k + 1, tok, out);
      return;
    }
    case Kind::kByteLevel:
    case Kind::kFuse:
      return;  // unreachable: these end the token phase
  }
}

void DecodeStream::flush_token_step(size_t k, std::string& out) {
  if (spec_->steps()[k].kind != Kind::kByteFallback || bytes_[k].empty()) return;
  std::vector<std::string> pieces;
  flush_fallback(bytes_[k], pieces);
  for (const std::string& p : pieces) feed_token(k + 1, p, out);
}

void DecodeStream::feed_text(size_t k, std::string_view text, std::string& out) {
  const auto& steps = spec_->steps();
  if (k >= steps.size()) {
    out.append(text);
    return;
  }
  const DecoderStep& s = steps[k];
  std::string fwd;
  switch (s.kind) {
    case Kind::kFuse:
      feed_text(k + 1, text, out);
      return;
    case Kind::kMetaspace:
      fwd = metaspace_token(s, text, /*first=*/true);  // after fusing there is one token
      break;
    case Kind::kStrip: {
      std::string& held = held_[k];
      for (size_t i = 0; i < text.size();) {
        char32_t cp;
        size_t len = utf8_decode_valid(text.data() + i, &cp);
        std::string_view ch = text.substr(i, len);
        i += len;
        if (!strip_started_[k]) {
          if (strip_seen_[k] < s.strip_start && cp == s.strip_content) {
            ++strip_seen_[k];
            continue;
          }
          strip_started_[k] = true;
        }
        if (s.strip_stop == 0) {
          fwd.append(ch);
        } else if (cp == s.strip_content) {
          held.append(ch);
          if (held.size() / len > s.strip_stop) {  // only the last `stop` may still be cut
            fwd.append(held, 0, len);
            held.erase(0, len);
          }
        } else {
          fwd += held;
          held.clear();
          fwd.append(ch);
        }
      }
      break;
    }
    case Kind::kReplace: {
      std::string buf = held_[k];
      buf.append(text);
      const std::string& pat = s.literal;
      size_t pos = 0;
      for (size_t q; (q = buf.find(pat, pos)) != std::string::npos; pos = q + pat.size()) {
        fwd.append(buf, pos, q - pos);
        fwd += s.content;
      }
      // Keep the longest tail that could still begin a match.
      size_t rest = buf.size() - pos, keep = 0;
      for (size_t len = std::min(rest, pat.size() - 1); len > 0; --len) {
        if (buf.compare(buf.size() - len, len, pat, 0, len) == 0) {
          keep = len;
          break;
        }
      }
      fwd.append(buf, pos, rest - keep);
      held_[k] = buf.substr(buf.size() - keep);
      break;
    }
    case Kind::kByteLevel:
    case Kind::kByteFallback:
      return;  // not streamable: excluded by DecoderSpec::streamable()
  }
  if (!fwd.empty()) feed_text(k + 1, fwd, out);
}

void DecodeStream::finish_text(size_t k, std::string& out) {
  const auto& steps = spec_->steps();
  for (; k < steps.size(); ++k) {
    std::string held;
    held.swap(held_[k]);
    if (steps[k].kind == Kind::kStrip) continue;  // trailing content chars are cut
    if (!held.empty()) feed_text(k + 1, held, out);
  }
}

}  // namespace m3::tok
