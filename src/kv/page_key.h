// Content keys for KV pages outside the device pool: the key of a page is a 128-bit hash chained
// over the keys of the pages before it, so it names the whole token prefix up to the page's end,
// and the chain starts from the model's identity, so another model (or another KV layout) never
// shares a key. Not a cryptographic hash: the disk tier also stores the page's own tokens and its
// parent's key and checks both on load, so reusing a wrong page takes a 128-bit collision of a
// chain that also ends in the same page of tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace m3 {

struct PageKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
  friend bool operator==(const PageKey&, const PageKey&) = default;
  // 32 lower-case hex digits (hi then lo): the disk tier's file name.
  std::string hex() const;
};

// The chain's start: a key of the model identity string (model, dtype, KV layout, page size).
PageKey root_page_key(std::string_view model_identity);
// The key of a page of `tokens` following the page keyed `parent`.
PageKey chain_page_key(const PageKey& parent, std::span<const int32_t> tokens);
// A 64-bit checksum of bytes (the disk tier's file check).
uint64_t checksum64(const void* data, size_t size);

}  // namespace m3
