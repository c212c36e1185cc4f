// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocab, ranked merges, unk token
// (fused or not), byte_fallback (<0xHH> tokens), continuing_subword_prefix, end_of_word_suffix,
// ignore_merges. The merge loop is HF's: a min-heap of (rank, position) over a linked list of
// symbols, stale entries skipped. Results per pre-token are cached per thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace m3::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `byte_level_input`: pieces handed to tokenize() are raw bytes whose vocab spelling is the
  // GPT-2 byte-to-unicode mapping (the pre-tokenizer's ByteLevel step was left to us).
  static Result<BpeModel> from_json(const nlohmann::json& model, bool byte_level_input);

  // Appends the ids of one pre-token (non-empty) to out.
  void tokenize(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocab string of id, or nullptr.
  const std::string* id_to_token(int32_t id) const;
  size_t vocab_count() const { return vocab_.size(); }  // HF's model.get_vocab_size()
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct MergeEntry {
    uint64_t key;  // (left id << 32) | right id; 0 with rank UINT32_MAX marks an empty slot
    uint32_t rank;
    int32_t new_id;
  };
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;  // bytes of the piece covered (0 = merged away)
  };

  const MergeEntry* find_merge(int32_t a, int32_t b) const;
  void merge_word(std::string_view w, std::vector<int32_t>& out) const;
  void merge_symbols(std::vector<Symbol>& symbols, std::vector<int32_t>& out) const;
  void tokenize_uncached(std::string_view piece, std::vector<int32_t>& out) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;  // "" for ids without a vocab entry
  std::vector<uint8_t> has_id_;
  std::vector<MergeEntry> merges_;        // open addressing, power-of-two size
  uint64_t merge_mask_ = 0;
  std::optional<std::string> unk_token_;
  int32_t unk_id_ = -1;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_fallback_ids_{};  // <0xHH> ids, -1 when absent

  // Ids of single-character tokens below U+10000 (-1: none), used by merge_word when there is no
  // continuing_subword_prefix / end_of_word_suffix; saves a string hash per character.
  std::vector<int32_t> bmp_char_id_;

  bool byte_level_input_ = false;
  // byte_level_input_: id of the single-byte symbol for byte b, -1 when the vocab lacks it (or
  // when prefix/suffix options make the per-position spelling differ: then the slow path runs).
  std::array<int32_t, 256> byte_symbol_{};
  bool byte_symbols_simple_ = false;
  StringIdMap raw_vocab_;  // byte_level_input_ && ignore_merges_: raw bytes -> id
  uint64_t cache_id_ = 0;
};

}  // namespace m3::tok
