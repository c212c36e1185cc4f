#include "server/handlers/logprobs_json.h"

#include <algorithm>
#include <cmath>

namespace m3::server {

using json = nlohmann::ordered_json;

namespace {

// vLLM clamps -inf to -9999.0 (a number a JSON client can parse).
double finite(float lp) {
  return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0;
}

// Invalid UTF-8 (a lone piece of a multi-byte character) -> U+FFFD per bad byte, as Python's
// bytes.decode(errors="replace") does for a truncated sequence; valid input is unchanged.
std::string valid_utf8(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80                          ? 1
                 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2
                 : (c & 0xF0) == 0xE0              ? 3
                 : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4
                                                   : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

LogprobsBuilder::LogprobsBuilder(const TextCodec* codec, bool chat, int64_t text_offset)
    : codec_(codec), chat_(chat), offset_(text_offset) {
  take();
}

const std::string& LogprobsBuilder::token_text(int32_t token) {
  auto it = cache_.find(token);
  if (it != cache_.end()) return it->second;
  auto text = codec_->decode({token}, /*skip_special_tokens=*/false);
  return cache_.emplace(token, text.is_ok() ? valid_utf8(*text) : std::string()).first->second;
}

json LogprobsBuilder::bytes_of(const std::string& s) const {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

void LogprobsBuilder::add(const std::vector<int32_t>& tokens,
                          const std::vector<TokenLogprobs>& logprobs) {
  static const TokenLogprobs kNone;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenLogprobs& lp = i < logprobs.size() ? logprobs[i] : kNone;
    const std::string text = token_text(tokens[i]);
    if (chat_) {
      json top = json::array();
      for (const auto& [id, v] : lp.top) {
        const std::string& t = token_text(id);
        top.push_back({{"token", t}, {"logprob", finite(v)}, {"bytes", bytes_of(t)}});
      }
      content_.push_back({{"token", text},
                          {"logprob", finite(lp.logprob)},
                          {"bytes", bytes_of(text)},
                          {"top_logprobs", std::move(top)}});
    } else {
      // Keys are token strings: two ids that decode alike keep the first (higher) logprob.
      json top = json::object();
      for (const auto& [id, v] : lp.top) {
        const std::string& t = token_text(id);
        if (!top.contains(t)) top[t] = finite(v);
      }
      tokens_.push_back(text);
      token_logprobs_.push_back(finite(lp.logprob));
      top_logprobs_.push_back(std::move(top));
      text_offset_.push_back(offset_);
      offset_ += utf8_length(text);
    }
    ++pending_;
  }
}

json LogprobsBuilder::take(bool even_if_empty) {
  json out;
  if (pending_ > 0 || even_if_empty) {
    if (chat_) {
      out = {{"content", std::move(content_)}};
    } else {
      out = {{"tokens", std::move(tokens_)},
             {"token_logprobs", std::move(token_logprobs_)},
             {"top_logprobs", std::move(top_logprobs_)},
             {"text_offset", std::move(text_offset_)}};
    }
  }
  pending_ = 0;
  content_ = json::array();
  tokens_ = json::array();
  token_logprobs_ = json::array();
  top_logprobs_ = json::array();
  text_offset_ = json::array();
  return out;
}

}  // namespace m3::server
