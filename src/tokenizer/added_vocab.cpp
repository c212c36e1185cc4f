#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace m3::tok {
namespace {

char32_t last_char(std::string_view s) {
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  char32_t cp;
  utf8_decode_valid(s.data() + k, &cp);
  return cp;
}

// HF: Regex(r"\w$") on the text before the token.
bool ends_with_word(std::string_view s) { return !s.empty() && is_word_char(last_char(s)); }

// HF: Regex(r"^\w") on the text after the token.
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  char32_t cp;
  utf8_decode_valid(s.data(), &cp);
  return is_word_char(cp);
}

// Start of the whitespace run that ends s (HF: Regex(r"\s*$").find(s).start()).
size_t space_leftmost_at_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t k = end - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    char32_t cp;
    utf8_decode_valid(s.data() + k, &cp);
    if (!is_white_space(cp)) break;
    end = k;
  }
  return end;
}

// Length of the whitespace run that starts s (HF: Regex(r"^\s*").find(s).end()).
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    size_t len = utf8_decode_valid(s.data() + i, &cp);
    if (!is_white_space(cp)) break;
    i += len;
  }
  return i;
}

}  // namespace

void TokenTrie::insert(std::string_view pattern, int32_t id) {
  if (pattern.empty()) return;
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  int32_t node = 0;
  for (unsigned char b : pattern) {
    auto& ch = nodes_[node].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), b,
                               [](const auto& e, unsigned char v) { return e.first < v; });
    if (it != ch.end() && it->first == b) {
      node = it->second;
    } else {
      int32_t fresh = static_cast<int32_t>(nodes_.size());
      ch.insert(it, {b, fresh});
      nodes_.emplace_back();  // may reallocate: `ch` is not used after this
      node = fresh;
    }
  }
  nodes_[node].id = id;  // a later token with the same pattern wins
}

size_t TokenTrie::longest_at(std::string_view s, size_t pos, int32_t* id) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    const auto& ch = nodes_[node].children;
    unsigned char b = static_cast<unsigned char>(s[i]);
    auto it = std::lower_bound(ch.begin(), ch.end(), b,
                               [](const auto& e, unsigned char v) { return e.first < v; });
    if (it == ch.end() || it->first != b) break;
    node = it->second;
    if (nodes_[node].id >= 0) {
      best = i + 1 - pos;
      *id = nodes_[node].id;
    }
  }
  return best;
}

void AddedVocab::add(const AddedToken& token, const std::string& normalized_pattern) {
  if (token.content.empty()) return;
  auto it = by_id_.find(token.id);
  if (it != by_id_.end()) {
    tokens_[it->second] = token;
  } else {
    by_id_[token.id] = tokens_.size();
    tokens_.push_back(token);
  }
  by_content_[token.content] = token.id;
  if (token.special) special_contents_.insert(token.content);
  if (token.normalized && normalized_pattern != token.content) {
    normalized_form_[token.id] = normalized_pattern;
  } else {
    normalized_form_.erase(token.id);
  }
}

void AddedVocab::build() {
  raw_trie_ = TokenTrie();
  normalized_trie_ = TokenTrie();
  for (const AddedToken& t : tokens_) {
    if (t.normalized) {
      auto it = normalized_form_.find(t.id);
      normalized_trie_.insert(it == normalized_form_.end() ? t.content : it->second, t.id);
    } else {
      raw_trie_.insert(t.content, t.id);
    }
  }
}

void AddedVocab::find_matches(std::string_view text, bool normalized,
                              std::vector<AddedSplit>& out) const {
  const TokenTrie& trie = normalized ? normalized_trie_ : raw_trie_;
  if (text.empty()) return;  // HF yields one empty split, which is then dropped
  if (trie.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t search = 0;
  while (search < text.size()) {
    // Leftmost-longest: the first position with a match, its longest pattern.
    size_t pos = search, len = 0;
    int32_t id = -1;
    for (; pos < text.size(); ++pos) {
      if (!trie.may_start(static_cast<unsigned char>(text[pos]))) continue;
      len = trie.longest_at(text, pos, &id);
      if (len != 0) break;
    }
    if (len == 0) break;
    size_t start = pos, stop = pos + len;
    search = stop;  // the automaton resumes after the raw match, whatever the stripping
    const AddedToken* tok = by_id(id);
    if (tok->single_word) {
      bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok->lstrip) start = std::max(space_leftmost_at_end(text.substr(0, start)), start_offset);
    if (tok->rstrip) stop += space_rightmost_at_start(text.substr(stop));
    // A match inside the spaces a previous rstrip token swallowed (only possible for tokens that
    // start with whitespace): HF would emit overlapping pieces; we drop the overlap instead.
    start = std::max(start, start_offset);
    if (stop <= start_offset) continue;
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), -1});
}

const AddedToken* AddedVocab::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocab::by_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : by_id(it->second);
}

bool AddedVocab::is_special_content(std::string_view content) const {
  return special_contents_.count(std::string(content)) != 0;
}

const std::string* AddedVocab::decode_string(int32_t id) const {
  auto n = normalized_form_.find(id);
  if (n != normalized_form_.end()) return &n->second;
  const AddedToken* t = by_id(id);
  return t ? &t->content : nullptr;
}

}  // namespace m3::tok
