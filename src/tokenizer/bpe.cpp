#include "tokenizer/bpe.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace m3::tok {
namespace {

using json = nlohmann::json;

constexpr uint64_t kEmptyKey = ~0ull;
constexpr size_t kMaxCachedPieceBytes = 256;  // as HF's BPE cache
constexpr size_t kMaxCacheEntries = 1 << 16;

std::atomic<uint64_t> g_next_cache_id{1};

uint64_t merge_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Fibonacci hashing: the top bits of the product mix every bit of the key.
size_t merge_slot(uint64_t key, uint64_t mask) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>((h ^ (h >> 29) ^ (h >> 41)) & mask);
}

// Per-thread cache of pre-token -> ids, one per model (a few models per thread at most).
struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> map;
  std::vector<int32_t> ids;
  void reset(uint64_t new_owner) {
    owner = new_owner;
    map.clear();
    ids.clear();
  }
};

PieceCache& cache_for(uint64_t owner) {
  constexpr size_t kSlots = 4;
  thread_local std::array<PieceCache, kSlots> slots;
  thread_local size_t next = 0;
  for (PieceCache& c : slots) {
    if (c.owner == owner) return c;
  }
  PieceCache& c = slots[next];
  next = (next + 1) % kSlots;
  c.reset(owner);
  return c;
}

struct HeapItem {
  uint32_t rank;
  int32_t pos;
  int32_t new_id;
};
// std heap functions build a max-heap; "greater" puts the lowest (rank, pos) on top.
struct HeapGreater {
  bool operator()(const HeapItem& a, const HeapItem& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

size_t StringHash::operator()(std::string_view s) const noexcept {
  return static_cast<size_t>(XXH3_64bits(s.data(), s.size()));
}

Result<BpeModel> BpeModel::from_json(const json& m, bool byte_level_input) {
  BpeModel bpe;
  bpe.cache_id_ = g_next_cache_id.fetch_add(1);
  bpe.byte_level_input_ = byte_level_input;
  if (!m.contains("vocab") || !m["vocab"].is_object()) {
    return invalid_argument("tokenizer.json: model.vocab must be an object");
  }
  int32_t max_id = -1;
  bpe.vocab_.reserve(m["vocab"].size());
  for (const auto& [tok, idj] : m["vocab"].items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() > INT32_MAX / 2) {
      return invalid_argument("tokenizer.json: model.vocab['" + tok + "'] is not a valid id");
    }
    int32_t id = idj.get<int32_t>();
    bpe.vocab_[tok] = id;
    max_id = std::max(max_id, id);
  }
  bpe.id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  bpe.has_id_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [tok, id] : bpe.vocab_) {
    bpe.id_to_token_[id] = tok;
    bpe.has_id_[id] = 1;
  }
  auto opt_string = [&](const char* key) -> std::string {
    return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
  };
  bpe.continuing_subword_prefix_ = opt_string("continuing_subword_prefix");
  bpe.end_of_word_suffix_ = opt_string("end_of_word_suffix");
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    bpe.unk_token_ = m["unk_token"].get<std::string>();
    auto it = bpe.vocab_.find(*bpe.unk_token_);
    if (it != bpe.vocab_.end()) bpe.unk_id_ = it->second;
  }
  bpe.fuse_unk_ = m.value("fuse_unk", false);
  bpe.byte_fallback_ = m.value("byte_fallback", false);
  bpe.ignore_merges_ = m.value("ignore_merges", false);
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0.0) {
    return unimplemented("tokenizer.json: BPE dropout is not supported (inference is deterministic)");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = bpe.vocab_.find(std::string_view(name));
    bpe.byte_fallback_ids_[b] = it == bpe.vocab_.end() ? -1 : it->second;
  }

  // Merges: ["a b", ...] (legacy) or [["a", "b"], ...]; rank = position; a later duplicate wins.
  const json merges = m.value("merges", json::array());
  if (!merges.is_array()) return invalid_argument("tokenizer.json: model.merges must be an array");
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  bpe.merges_.assign(cap, MergeEntry{kEmptyKey, 0, -1});
  bpe.merge_mask_ = cap - 1;
  const size_t prefix_len = bpe.continuing_subword_prefix_.size();
  std::string a, b, joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& e = merges[rank];
    if (e.is_string()) {
      const std::string& line = e.get_ref<const std::string&>();
      size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
        return invalid_argument("tokenizer.json: model.merges[" + std::to_string(rank) +
                                "] is not two tokens separated by one space");
      }
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return invalid_argument("tokenizer.json: model.merges[" + std::to_string(rank) +
                              "] is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto ia = bpe.vocab_.find(a), ib = bpe.vocab_.find(b);
    if (ia == bpe.vocab_.end() || ib == bpe.vocab_.end()) {
      return invalid_argument("tokenizer.json: merge token '" +
                              (ia == bpe.vocab_.end() ? a : b) + "' is not in the vocab");
    }
    joined = a;
    joined.append(b, std::min(prefix_len, b.size()), std::string::npos);
    auto in = bpe.vocab_.find(joined);
    if (in == bpe.vocab_.end()) {
      return invalid_argument("tokenizer.json: merged token '" + joined + "' is not in the vocab");
    }
    uint64_t key = merge_key(ia->second, ib->second);
    size_t slot = merge_slot(key, bpe.merge_mask_);
    while (bpe.merges_[slot].key != kEmptyKey && bpe.merges_[slot].key != key) {
      slot = (slot + 1) & bpe.merge_mask_;
    }
    bpe.merges_[slot] = MergeEntry{key, static_cast<uint32_t>(rank), in->second};
  }

  if (bpe.continuing_subword_prefix_.empty() && bpe.end_of_word_suffix_.empty()) {
    bpe.bmp_char_id_.assign(0x10000, -1);
    for (const auto& [tok, id] : bpe.vocab_) {
      if (tok.empty() || tok.size() > 3) continue;
      char32_t cp;
      if (utf8_decode_valid(tok.data(), &cp) == tok.size() && cp < 0x10000) bpe.bmp_char_id_[cp] = id;
    }
  }
  if (byte_level_input) {
    bpe.byte_symbols_simple_ =
        bpe.continuing_subword_prefix_.empty() && bpe.end_of_word_suffix_.empty();
    std::string s;
    for (int byte = 0; byte < 256; ++byte) {
      s.clear();
      utf8_append(s, byte_char(static_cast<unsigned char>(byte)));
      auto it = bpe.vocab_.find(s);
      bpe.byte_symbol_[byte] = it == bpe.vocab_.end() ? -1 : it->second;
      if (it == bpe.vocab_.end()) bpe.byte_symbols_simple_ = false;
    }
    if (bpe.ignore_merges_) {
      bpe.raw_vocab_.reserve(bpe.vocab_.size());
      std::string raw;
      for (const auto& [tok, id] : bpe.vocab_) {
        raw.clear();
        bool ok = true;
        for (size_t i = 0; i < tok.size() && ok;) {
          char32_t cp;
          i += utf8_decode_valid(tok.data() + i, &cp);
          int byte = char_byte(cp);
          if (byte < 0) ok = false;
          else raw.push_back(static_cast<char>(byte));
        }
        if (ok) bpe.raw_vocab_.emplace(raw, id);
      }
    }
  }
  return bpe;
}

const BpeModel::MergeEntry* BpeModel::find_merge(int32_t a, int32_t b) const {
  uint64_t key = merge_key(a, b);
  size_t slot = merge_slot(key, merge_mask_);
  while (true) {
    const MergeEntry& e = merges_[slot];
    if (e.key == key) return &e;
    if (e.key == kEmptyKey) return nullptr;
    slot = (slot + 1) & merge_mask_;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::merge_symbols(std::vector<Symbol>& sym, std::vector<int32_t>& out) const {
  const int32_t n = static_cast<int32_t>(sym.size());
  thread_local std::vector<HeapItem> heap;
  heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const MergeEntry* m = find_merge(sym[i].id, sym[i + 1].id)) {
      heap.push_back({m->rank, i, m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), HeapGreater());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), HeapGreater());
    HeapItem top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = sym[next_pos];
    const MergeEntry* m = find_merge(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    sym[next_pos].len = 0;
    if (right.next >= 0 && right.next < n) sym[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeEntry* pm = find_merge(sym[cur.prev].id, cur.id)) {
        heap.push_back({pm->rank, cur.prev, pm->new_id});
        std::push_heap(heap.begin(), heap.end(), HeapGreater());
      }
    }
    if (cur.next >= 0 && cur.next < n) {
      if (const MergeEntry* nm = find_merge(cur.id, sym[cur.next].id)) {
        heap.push_back({nm->rank, top.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end(), HeapGreater());
      }
    }
  }
  for (const Symbol& s : sym) {
    if (s.len != 0) out.push_back(s.id);
  }
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> sym;
  sym.clear();
  auto add = [&](int32_t id, uint32_t len) {
    int32_t pos = static_cast<int32_t>(sym.size());
    sym.push_back({id, pos - 1, pos + 1, len});
  };
  int32_t unk_id = -1;
  uint32_t unk_len = 0;
  bool have_unk = false;
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t len = utf8_len_from_lead(static_cast<unsigned char>(w[i]));
    if (i + len > w.size()) len = w.size() - i;
    bool is_first = i == 0, is_last = i + len >= w.size();
    int32_t char_id = -1;
    if (!bmp_char_id_.empty() && len <= 3) {
      char32_t cp;
      utf8_decode_valid(w.data() + i, &cp);
      char_id = bmp_char_id_[cp];
      if (char_id < 0) s.assign(w.substr(i, len));  // for byte fallback below
    } else {
      s.clear();
      if (!is_first) s.append(continuing_subword_prefix_);
      s.append(w.substr(i, len));
      if (is_last) s.append(end_of_word_suffix_);
      auto it = vocab_.find(s);
      if (it != vocab_.end()) char_id = it->second;
    }
    if (char_id >= 0) {
      if (have_unk) {
        add(unk_id, unk_len);
        have_unk = false;
      }
      add(char_id, static_cast<uint32_t>(len));
    } else {
      bool done = false;
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char c : s) all = all && byte_fallback_ids_[c] >= 0;
        if (all) {
          // HF does not flush a pending unk here; it lands after the bytes (kept identical).
          for (unsigned char c : s) add(byte_fallback_ids_[c], 1);
          done = true;
        }
      }
      if (!done && unk_token_ && unk_id_ >= 0) {
        if (have_unk && fuse_unk_) {
          unk_len += static_cast<uint32_t>(len);
        } else {
          if (have_unk) add(unk_id, unk_len);
          unk_id = unk_id_;
          unk_len = static_cast<uint32_t>(len);
          have_unk = true;
        }
      }
      // No unk token (or one missing from the vocab, an error in HF): the character is dropped.
    }
    i += len;
  }
  if (have_unk) add(unk_id, unk_len);
  if (!sym.empty()) sym.back().next = -1;
  merge_symbols(sym, out);
}

void BpeModel::tokenize_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    const StringIdMap& map = byte_level_input_ ? raw_vocab_ : vocab_;
    auto it = map.find(piece);
    if (it != map.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (!byte_level_input_) {
    merge_word(piece, out);
    return;
  }
  if (byte_symbols_simple_) {
    thread_local std::vector<Symbol> sym;
    sym.clear();
    const int32_t n = static_cast<int32_t>(piece.size());
    for (int32_t i = 0; i < n; ++i) {
      sym.push_back({byte_symbol_[static_cast<unsigned char>(piece[i])], i - 1,
                     i + 1 < n ? i + 1 : -1, 1});
    }
    merge_symbols(sym, out);
    return;
  }
  std::string mapped;
  mapped.reserve(piece.size() * 2);
  for (unsigned char c : piece) utf8_append(mapped, byte_char(c));
  merge_word(mapped, out);
}

void BpeModel::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() > kMaxCachedPieceBytes) {
    tokenize_uncached(piece, out);
    return;
  }
  PieceCache& cache = cache_for(cache_id_);
  auto it = cache.map.find(piece);
  if (it != cache.map.end()) {
    out.insert(out.end(), cache.ids.begin() + it->second.first,
               cache.ids.begin() + it->second.first + it->second.second);
    return;
  }
  size_t before = out.size();
  tokenize_uncached(piece, out);
  if (cache.map.size() >= kMaxCacheEntries) {
    cache.map.clear();
    cache.ids.clear();
  }
  uint32_t off = static_cast<uint32_t>(cache.ids.size());
  cache.ids.insert(cache.ids.end(), out.begin() + before, out.end());
  cache.map.emplace(std::string(piece), std::make_pair(off, static_cast<uint32_t>(out.size() - before)));
}

}  // namespace m3::tok
