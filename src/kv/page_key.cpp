#include "kv/page_key.h"

#include <cstring>

namespace m3 {
namespace {

// A 64-bit finaliser with full avalanche (the "moremur" constants of splitmix-style mixers).
uint64_t mix64(uint64_t x) {
  x ^= x >> 27;
  x *= 0x3C79AC492BA7B653ULL;
  x ^= x >> 33;
  x *= 0x1C69B3F74AC4AE35ULL;
  x ^= x >> 27;
  return x;
}

// Two independent lanes over the same words: each word enters both lanes with a different
// multiplier and the lanes are cross-mixed at the end, so the pair behaves as one 128-bit state.
struct Hasher128 {
  uint64_t a, b;
  Hasher128(uint64_t seed_a, uint64_t seed_b) : a(seed_a), b(seed_b) {}
  void word(uint64_t w) {
    a = mix64(a ^ (w * 0x9E3779B97F4A7C15ULL));
    b = mix64(b + (w ^ 0xD6E8FEB86659FD93ULL) * 0xC2B2AE3D27D4EB4FULL);
  }
  PageKey finish(uint64_t length) {
    word(length);
    PageKey k;
    k.hi = mix64(a ^ mix64(b + 0x165667B19E3779F9ULL));
    k.lo = mix64(b ^ mix64(a + 0x27D4EB2F165667C5ULL));
    return k;
  }
};

void bytes_into(Hasher128& h, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h.word(w);
  }
  uint64_t tail = 0;
  for (size_t j = 0; i < size; ++i, ++j) tail |= uint64_t(p[i]) << (8 * j);
  h.word(tail);
}

}  // namespace

std::string PageKey::hex() const {
  static const char* kDigits = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[static_cast<size_t>(i)] = kDigits[(hi >> (60 - 4 * i)) & 0xF];
    s[static_cast<size_t>(16 + i)] = kDigits[(lo >> (60 - 4 * i)) & 0xF];
  }
  return s;
}

PageKey root_page_key(std::string_view model_identity) {
  Hasher128 h(0x6D33736572766521ULL, 0x6B762D7469657273ULL);
  bytes_into(h, model_identity.data(), model_identity.size());
  return h.finish(model_identity.size());
}

PageKey chain_page_key(const PageKey& parent, std::span<const int32_t> tokens) {
  Hasher128 h(parent.hi, parent.lo);
  for (int32_t t : tokens) h.word(static_cast<uint32_t>(t));
  return h.finish(tokens.size());
}

uint64_t checksum64(const void* data, size_t size) {
  Hasher128 h(0x636865636B73756DULL, 0x6B7670616765732EULL);
  bytes_into(h, data, size);
  return h.finish(size).lo;
}

}  // namespace m3
