// Added tokens (tokenizer.json "added_tokens"): matched in the text before the model runs, with
// HF's rules: leftmost-longest matching, first against the raw text for tokens with
// normalized=false, then against each normalized segment for normalized=true tokens; single_word,
// lstrip and rstrip as in HF's AddedVocabulary::find_matches. Special or not, every added token is
// matched (HF's default; encode_special_tokens=false).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace m3::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
};

// A byte trie over token patterns; finds the longest pattern starting at a position.
class TokenTrie {
 public:
  void insert(std::string_view pattern, int32_t id);
  bool empty() const { return nodes_.size() <= 1; }
  // Longest match at s[pos...]: returns its length (0: none) and sets *id.
  size_t longest_at(std::string_view s, size_t pos, int32_t* id) const;
  // Whether a pattern can start with byte b (cheap pre-filter).
  bool may_start(unsigned char b) const { return first_byte_[b]; }

 private:
  struct Node {
    int32_t id = -1;
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
  };
  std::vector<Node> nodes_{Node{}};
  bool first_byte_[256] = {};
};

// One piece of the split text: either an added token or text to normalize/pre-tokenize.
struct AddedSplit {
  size_t start, end;  // byte range in the text given to find_matches
  int32_t id;         // -1 for text
};

class AddedVocab {
 public:
  // `tokens` in tokenizer.json order. Patterns of normalized tokens are their normalized form,
  // given by the caller (normalize_fn applied to content); `model_lookup` gives a model id.
  void add(const AddedToken& token, const std::string& normalized_pattern);
  void build();

  // Splits `text` on the tokens of one trie (normalized or not), appending to out.
  void find_matches(std::string_view text, bool normalized, std::vector<AddedSplit>& out) const;

  bool has_normalized() const { return !normalized_trie_.empty(); }
  bool has_raw() const { return !raw_trie_.empty(); }

  const AddedToken* by_id(int32_t id) const;
  const AddedToken* by_content(std::string_view content) const;
  bool is_special_content(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // The string HF decodes this added token as (its normalized form for normalized tokens).
  const std::string* decode_string(int32_t id) const;

 private:
  std::vector<AddedToken> tokens_;  // one per id (the last definition of an id wins)
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, std::string> normalized_form_;
  std::unordered_set<std::string> special_contents_;
  TokenTrie raw_trie_, normalized_trie_;
};

}  // namespace m3::tok
