#include "server/fake/fake_codec.h"

#include <array>

namespace m3::server {

namespace {

constexpr std::array<std::string_view, 10> kSpecials = {
    "]~!b[", "]~b]", "[e~[", "<mm:think>", "</mm:think>", "]<]minimax[>[", "]<]image[>[", "]!p~[",
    "]<]start of image[>[", "]<]end of image[>["};

}  // namespace

Result<std::vector<int32_t>> FakeCodec::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    bool matched = false;
    for (size_t s = 0; s < kSpecials.size(); ++s) {
      if (text.substr(i, kSpecials[s].size()) == kSpecials[s]) {
        out.push_back(256 + static_cast<int32_t>(s));
        i += kSpecials[s].size();
        matched = true;
        break;
      }
    }
    if (!matched) out.push_back(static_cast<unsigned char>(text[i++]));
  }
  return out;
}

std::string FakeCodec::piece(int32_t id) {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  if (id >= 256 && id < 256 + static_cast<int32_t>(kSpecials.size()))
    return std::string(kSpecials[id - 256]);
  return "";
}

Result<std::string> FakeCodec::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return invalid_argument("token id " + std::to_string(id) + " is out of range [0, " +
                              std::to_string(vocab_size()) + ")");
    }
    if (id >= 256 && skip_special) continue;
    out += piece(id);
  }
  return out;
}

int32_t FakeCodec::vocab_size() const {
  return 256 + static_cast<int32_t>(kSpecials.size());
}

std::optional<int32_t> FakeCodec::token_id(std::string_view token) const {
  for (size_t s = 0; s < kSpecials.size(); ++s)
    if (kSpecials[s] == token) return 256 + static_cast<int32_t>(s);
  return std::nullopt;
}

}  // namespace m3::server
