// Unit tests of the tokenizer pieces on small hand-made tokenizer.json files: UTF-8 repair,
// regex translation, split behaviours, BPE merge order, byte fallback and unk, added-token rules
// (lstrip, rstrip, single_word, normalized, punctuation-soup specials), decoders (streaming ==
// batch), post-processors and the incremental detokenizer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include <utf8proc.h>

#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace m3 {
namespace {

using json = nlohmann::json;
using tok::utf8_sanitize;

std::string u8(char32_t c) {
  std::string s;
  tok::utf8_append(s, c);
  return s;
}

// ---------------------------------------------------------------------------------------------
// UTF-8

TEST(Utf8, SanitizeMatchesPythonReplace) {
  // Expected strings: Python's bytes.decode("utf-8", "replace") (maximal subparts).
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_sanitize("abc\x80" "def"), "abc" + R + "def");
  EXPECT_EQ(utf8_sanitize("ni\xE4\xBD hao"), "ni" + R + " hao");
  EXPECT_EQ(utf8_sanitize("end\xF0\x9F\x98"), "end" + R);
  EXPECT_EQ(utf8_sanitize("over\xC0\xAFlong \xE0\x80\xAF"), "over" + R + R + "long " + R + R + R);
  EXPECT_EQ(utf8_sanitize("sur\xED\xA0\x80rogate"), "sur" + R + R + R + "rogate");
  EXPECT_EQ(utf8_sanitize("\xFF\xFE x"), R + R + " x");
  EXPECT_EQ(utf8_sanitize("ok \xE4\xBD\xA0 bad \xE4\xBD \xF4\x90\x80\x80 \xC3( end"),
            "ok \xE4\xBD\xA0 bad " + R + " " + R + R + R + R + " " + R + "( end");
  EXPECT_EQ(utf8_sanitize("\xF0\x9F\x98\x80\xF0"), "\xF0\x9F\x98\x80" + R);
  EXPECT_EQ(utf8_sanitize("valid \xEF\xBF\xBD stays"), "valid \xEF\xBF\xBD stays");
  EXPECT_TRUE(tok::utf8_is_valid("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(tok::utf8_is_valid("\xC3"));
  EXPECT_FALSE(tok::utf8_is_valid("\xED\xA0\x80"));
}

TEST(Utf8, LossyStreamEqualsWholeForEverySplit) {
  const std::string bytes = "a\xE4\xBD\xA0\xE4\xBD z\xF0\x9F\x98\x80\xF0\x9F\x80\xFF\xC3";
  const std::string whole = utf8_sanitize(bytes);
  for (size_t cut1 = 0; cut1 <= bytes.size(); ++cut1) {
    for (size_t cut2 = cut1; cut2 <= bytes.size(); ++cut2) {
      tok::Utf8LossyStream s;
      std::string out, piece;
      for (auto part : {bytes.substr(0, cut1), bytes.substr(cut1, cut2 - cut1), bytes.substr(cut2)}) {
        piece.clear();
        s.push(part, piece);
        EXPECT_TRUE(tok::utf8_is_valid(piece));
        out += piece;
      }
      s.finish(out);
      ASSERT_EQ(out, whole) << "cuts " << cut1 << "," << cut2;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Unicode normalizers: the fast path (chunks whose characters cannot change are skipped) must
// equal the library on every code point, in contexts where composition could happen.

TEST(Normalizer, FastPathEqualsLibraryOnEveryCodePoint) {
  struct Form {
    const char* type;
    int options;
  };
  for (Form f : {Form{"NFC", UTF8PROC_COMPOSE}, Form{"NFD", UTF8PROC_DECOMPOSE},
                 Form{"NFKC", UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
                 Form{"NFKD", UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT}}) {
    auto n = tok::make_normalizer(json{{"type", f.type}});
    ASSERT_TRUE(n.is_ok());
    int failures = 0;
    for (char32_t c = 0x80; c < 0x30000 && failures < 5; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      for (const std::string& ctx : {"A" + u8(c) + "\xCC\x81" + u8(c) + "a",
                                     "\xE1\x84\x80" + u8(c) + "\xEA\xB0\x80" + u8(c)}) {
        utf8proc_uint8_t* want = nullptr;
        utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(ctx.data()),
                                            static_cast<utf8proc_ssize_t>(ctx.size()), &want,
                                            static_cast<utf8proc_option_t>(UTF8PROC_STABLE | f.options));
        ASSERT_GE(len, 0);
        std::string expected(reinterpret_cast<const char*>(want), static_cast<size_t>(len));
        std::free(want);
        std::string got = ctx;
        (*n)->normalize(got);
        if (got != expected) {
          ++failures;
          ADD_FAILURE() << f.type << " U+" << std::hex << static_cast<uint32_t>(c);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Regex translation (Oniguruma classes to PCRE2)

std::vector<std::string> matches(const std::string& pattern, const std::string& s) {
  auto re = tok::Regex::compile(pattern);
  EXPECT_TRUE(re.is_ok()) << re.status().to_string();
  std::vector<tok::Span> spans;
  re->find_all(s, spans);
  std::vector<std::string> out;
  for (auto sp : spans) out.push_back(s.substr(sp.start, sp.end - sp.start));
  return out;
}

TEST(Regex, OnigSpaceIncludesNextLine) {
  // Oniguruma's \s is Unicode White_Space, which has U+0085; PCRE2's \s lacks it.
  EXPECT_EQ(matches(R"(\s+)", "a\xC2\x85" "b"), std::vector<std::string>{"\xC2\x85"});
  EXPECT_EQ(matches(R"([^\s]+)", "a\xC2\x85" "b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(matches(R"(\S+)", "a\xC2\x85" "b"), (std::vector<std::string>{"a", "b"}));
}

TEST(Regex, OnigWordIsLetterMarkDigitConnector) {
  // ² (No) is not \w in Oniguruma; a combining mark is.
  EXPECT_EQ(matches(R"(\w+)", "x\xC2\xB2y e\xCC\x81"),
            (std::vector<std::string>{"x", "y", "e\xCC\x81"}));
}

TEST(Regex, Gpt2StyleContractionsAndLookahead) {
  const std::string pat =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(matches(pat, "It'S  ok\n\n x"),
            (std::vector<std::string>{"It", "'S", " ", " ok", "\n\n", " x"}));
}

TEST(Regex, EmptyMatchesAdvanceLikeOnig) {
  // onig: an empty match right after the previous match is refused; the search moves one char.
  EXPECT_EQ(matches("x*", "axxb"), (std::vector<std::string>{"", "xx", ""}));
}

TEST(Regex, InvalidPatternIsAnError) {
  auto re = tok::Regex::compile("(unclosed");
  ASSERT_FALSE(re.is_ok());
  EXPECT_NE(re.status().message().find("(unclosed"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Split behaviours (HF NormalizedString::split)

std::vector<std::string> split_with(tok::SplitBehavior b, const std::string& s) {
  // Matches: every '-'.
  std::vector<tok::Segment> seg;
  size_t last = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '-') {
      if (last < i) seg.push_back({last, i, false});
      seg.push_back({i, i + 1, true});
      last = i + 1;
    }
  }
  if (last < s.size()) seg.push_back({last, s.size(), false});
  std::vector<tok::Piece> out;
  tok::split_segments(tok::Piece{s, true}, seg, b, out);
  std::vector<std::string> r;
  for (auto& p : out) r.emplace_back(p.text);
  return r;
}

TEST(Split, EveryBehaviourMatchesHf) {
  // Expected values: HF tokenizers' docs for "the-final--countdown".
  const std::string s = "the-final--countdown";
  using B = tok::SplitBehavior;
  using V = std::vector<std::string>;
  EXPECT_EQ(split_with(B::kRemoved, s), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split_with(B::kIsolated, s), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split_with(B::kMergedWithPrevious, s), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split_with(B::kMergedWithNext, s), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split_with(B::kContiguous, s), (V{"the", "-", "final", "--", "countdown"}));
}

// ---------------------------------------------------------------------------------------------
// Toy tokenizers

json toy_bpe(json vocab, json merges) {
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", nullptr},
              {"model",
               {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab},
                {"merges", merges}}}};
}

Tokenizer make(const json& j) {
  auto t = Tokenizer::from_strings(j.dump());
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return std::move(t).value();
}

using Ids = std::vector<int32_t>;

TEST(Bpe, MergesApplyByRankNotPosition) {
  json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};
  Tokenizer t1 = make(toy_bpe(vocab, {"a b", "b c", "ab c"}));
  EXPECT_EQ(t1.encode("abc", false), (Ids{5}));
  Tokenizer t2 = make(toy_bpe(vocab, {"b c", "a b", "ab c"}));
  EXPECT_EQ(t2.encode("abc", false), (Ids{0, 4}));
  // Array-form merges are read the same.
  Tokenizer t3 = make(toy_bpe(vocab, json::array({json::array({"b", "c"}), json::array({"a", "b"})})));
  EXPECT_EQ(t3.encode("abc", false), (Ids{0, 4}));
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  json vocab = {{"a", 0}, {"aa", 1}};
  Tokenizer t = make(toy_bpe(vocab, {"a a"}));
  EXPECT_EQ(t.encode("aaa", false), (Ids{1, 0}));
  EXPECT_EQ(t.encode("aaaaa", false), (Ids{1, 1, 0}));
}

TEST(Bpe, UnknownMergeTokenIsALoadError) {
  auto t = Tokenizer::from_strings(toy_bpe({{"a", 0}}, {"a q"}).dump());
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("'q'"), std::string::npos) << t.status().message();
}

TEST(Bpe, ByteFallbackAndFusedUnk) {
  json vocab = {{"<unk>", 0}, {"a", 1}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 2 + b;
  }
  json j = toy_bpe(vocab, json::array());
  j["model"]["unk_token"] = "<unk>";
  j["model"]["byte_fallback"] = true;
  // é = C3 A9 -> two byte tokens.
  EXPECT_EQ(make(j).encode("a\xC3\xA9", false), (Ids{1, 2 + 0xC3, 2 + 0xA9}));
  j["model"]["byte_fallback"] = false;
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(make(j).encode("a\xC3\xA9xa", false), (Ids{1, 0, 1}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(make(j).encode("a\xC3\xA9xa", false), (Ids{1, 0, 0, 1}));
}

// A byte-level toy: the 256 byte characters, no merges, GPT-2 pre-tokenization.
json byte_level_toy() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[u8(tok::byte_char(static_cast<unsigned char>(b)))] = b;
  json j = toy_bpe(vocab, json::array());
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                        {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                  {"use_regex", true}};
  return j;
}

json added(const std::string& content, int id, bool special, bool lstrip = false,
           bool rstrip = false, bool single_word = false, bool normalized = false) {
  return {{"id", id},         {"content", content},  {"single_word", single_word},
          {"lstrip", lstrip}, {"rstrip", rstrip},    {"normalized", normalized},
          {"special", special}};
}

Ids bytes_of(const std::string& s) {
  Ids ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

Ids cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(AddedTokens, PunctuationSoupSpecialsAreSingleTokens) {
  json j = byte_level_toy();
  j["added_tokens"] = {added("]~b]", 256, true),        added("[e~[", 257, true),
                       added("]<]minimax[>[", 258, true), added("]<]", 259, false),
                       added("<mm:think>", 260, true),  added("</mm:think>", 261, true),
                       added("]~!b[", 262, true)};
  Tokenizer t = make(j);
  EXPECT_EQ(t.encode("]~b]", false), (Ids{256}));
  EXPECT_EQ(t.encode("]~!b[]~b]system\n", false), cat({{262, 256}, bytes_of("system\n")}));
  EXPECT_EQ(t.encode("x[e~[\n", false), cat({bytes_of("x"), {257}, bytes_of("\n")}));
  // Longest match wins; a prefix of a longer token is its own token.
  EXPECT_EQ(t.encode("]<]minimax[>[<tool_call>", false), cat({{258}, bytes_of("<tool_call>")}));
  EXPECT_EQ(t.encode("]<]minimax[>", false), cat({{259}, bytes_of("minimax[>")}));
  EXPECT_EQ(t.encode("]]~b]]", false), cat({bytes_of("]"), {256}, bytes_of("]")}));
  EXPECT_EQ(t.encode("<mm:think>a</mm:think>", false), (Ids{260, 'a', 261}));
  EXPECT_EQ(t.token_to_id("[e~["), 257);
  EXPECT_EQ(t.id_to_token(258), "]<]minimax[>[");
  EXPECT_TRUE(t.is_special(256));
  EXPECT_FALSE(t.is_special(259));
  EXPECT_EQ(t.vocab_size(), 263u);
  const Ids ids = t.encode("]~b]hi]<][e~[", false);
  EXPECT_EQ(t.decode(ids, false), "]~b]hi]<][e~[");
  EXPECT_EQ(t.decode(ids, true), "hi]<]");
}

TEST(AddedTokens, LstripRstripSingleWord) {
  json j = byte_level_toy();
  j["added_tokens"] = {added("<l>", 256, true, /*lstrip=*/true), added("<r>", 257, true, false, true),
                       added("hello", 258, false, false, false, /*single_word=*/true)};
  Tokenizer t = make(j);
  EXPECT_EQ(t.encode("a   <l>b", false), cat({bytes_of("a"), {256}, bytes_of("b")}));
  EXPECT_EQ(t.encode("a<r> \t\nb", false), cat({bytes_of("a"), {257}, bytes_of("b")}));
  EXPECT_EQ(t.encode("hello world", false), cat({{258}, bytes_of(" world")}));
  EXPECT_EQ(t.encode("say hello!", false), cat({bytes_of("say "), {258}, bytes_of("!")}));
  EXPECT_EQ(t.encode("helloworld", false), bytes_of("helloworld"));
  EXPECT_EQ(t.encode("ahello", false), bytes_of("ahello"));
  EXPECT_EQ(t.encode("_hello", false), bytes_of("_hello"));  // '_' is a word character
}

TEST(AddedTokens, NormalizedTokensMatchNormalizedText) {
  json j = byte_level_toy();
  j["normalizer"] = {{"type", "Lowercase"}};
  j["added_tokens"] = {added("WORLD", 256, false, false, false, false, /*normalized=*/true),
                       added("RAW", 257, false, false, false, false, /*normalized=*/false)};
  Tokenizer t = make(j);
  // The normalized token's pattern is "world"; the raw one matches only "RAW" before lowercasing.
  EXPECT_EQ(t.encode("World RAW raw", false), cat({{256}, bytes_of(" "), {257}, bytes_of(" raw")}));
  EXPECT_EQ(t.decode(Ids{256}, false), "world");  // HF decodes the normalized form
}

TEST(Encode, InvalidUtf8IsReplacedNotFatal) {
  Tokenizer t = make(byte_level_toy());
  EXPECT_EQ(t.encode("a\xFF" "b", false), bytes_of("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(t.encode("\xE4\xBD", false), bytes_of("\xEF\xBF\xBD"));
  EXPECT_EQ(t.encode("", false), Ids{});
}

TEST(PostProcessor, TemplateAddsBosEosOnlyWhenAsked) {
  json j = byte_level_toy();
  j["added_tokens"] = {added("<s>", 256, true), added("</s>", 257, true)};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", {256}}, {"tokens", {"<s>"}}}},
        {"</s>", {{"id", "</s>"}, {"ids", {257}}, {"tokens", {"</s>"}}}}}}};
  Tokenizer t = make(j);
  EXPECT_EQ(t.encode("hi", true), (Ids{256, 'h', 'i', 257}));
  EXPECT_EQ(t.encode("hi", false), (Ids{'h', 'i'}));
  EXPECT_EQ(t.encode("", true), (Ids{256, 257}));
}

// ---------------------------------------------------------------------------------------------
// Decoders

std::string stream_all(const tok::DecoderSpec& spec, const std::vector<std::string>& tokens) {
  tok::DecodeStream s(&spec);
  std::string out, piece;
  for (const auto& t : tokens) {
    piece.clear();
    s.push(t, piece);
    EXPECT_TRUE(tok::utf8_is_valid(piece));
    out += piece;
  }
  s.finish(out);
  return out;
}

tok::DecoderSpec spec_of(const json& j) {
  auto s = tok::DecoderSpec::from_json(j);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return std::move(s).value();
}

TEST(Decoder, ByteFallbackGroupsInvalidBytesPerByte) {
  tok::DecoderSpec spec = spec_of({{"type", "Sequence"},
                                   {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}});
  const std::string R = "\xEF\xBF\xBD";
  std::vector<std::string> ok = {"<0xE4>", "<0xBD>", "<0xA0>", "a"};
  std::vector<std::string> bad = {"<0xE4>", "<0xBD>", "a", "<0x41>"};
  EXPECT_EQ(spec.apply_batch(ok), "\xE4\xBD\xA0" "a");
  EXPECT_EQ(spec.apply_batch(bad), R + R + "aA");  // one U+FFFD per byte of an invalid group
  EXPECT_EQ(stream_all(spec, ok), spec.apply_batch(ok));
  EXPECT_EQ(stream_all(spec, bad), spec.apply_batch(bad));
}

TEST(Decoder, ByteLevelUsesMaximalSubparts) {
  tok::DecoderSpec spec = spec_of({{"type", "ByteLevel"}});
  std::vector<std::string> toks = {u8(tok::byte_char(0xE4)), u8(tok::byte_char(0xBD)), "a"};
  EXPECT_EQ(spec.apply_batch(toks), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(stream_all(spec, toks), spec.apply_batch(toks));
  // A token with a character outside the byte table is taken as its own UTF-8.
  EXPECT_EQ(spec.apply_batch({"<\xEF\xBD\x9C" "x>"}), "<\xEF\xBD\x9C" "x>");
}

TEST(Decoder, StreamingEqualsBatchOnRandomTokens) {
  const std::string ms = "\xE2\x96\x81";
  std::vector<json> specs = {
      {{"type", "ByteLevel"}},
      {{"type", "Metaspace"}, {"replacement", ms}, {"prepend_scheme", "always"}, {"split", true}},
      {{"type", "Sequence"},
       {"decoders",
        {{{"type", "Replace"}, {"pattern", {{"String", ms}}}, {"content", " "}},
         {{"type", "ByteFallback"}},
         {{"type", "Fuse"}},
         {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}},
      {{"type", "Sequence"},
       {"decoders",
        {{{"type", "ByteFallback"}},
         {{"type", "Fuse"}},
         {{"type", "Replace"}, {"pattern", {{"String", ms + ms}}}, {"content", "<2>"}},
         {{"type", "Strip"}, {"content", " "}, {"start", 2}, {"stop", 2}},
         {{"type", "Metaspace"}, {"replacement", ms}, {"prepend_scheme", "never"}, {"split", true}}}}},
      {{"type", "Sequence"},
       {"decoders",
        {{{"type", "ByteFallback"}},
         {{"type", "Fuse"}},
         {{"type", "Replace"}, {"pattern", {{"Regex", ms + "+"}}}, {"content", "_"}}}}},
      nullptr,
  };
  const std::vector<std::string> alphabet = {ms,       ms + "a",   "b" + ms, " ",      "  x ",
                                             "<0xE4>", "<0xBD>",   "<0xA0>", "<0x20>", "<0xFF>",
                                             u8(0x120), u8(0x10A), "\xC3\xA9", "ab",   ""};
  std::mt19937 rng(7);
  for (const json& sj : specs) {
    tok::DecoderSpec spec = spec_of(sj);
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<std::string> toks(rng() % 9);
      for (auto& t : toks) t = alphabet[rng() % alphabet.size()];
      ASSERT_EQ(stream_all(spec, toks), spec.apply_batch(toks)) << sj.dump() << " trial " << trial;
    }
  }
}

TEST(IncrementalDetokenizer, HoldsIncompleteCharacters) {
  Tokenizer t = make(byte_level_toy());
  IncrementalDetokenizer d(t, false);
  EXPECT_EQ(d.feed(0xE4), "");
  EXPECT_EQ(d.feed(0xBD), "");
  EXPECT_EQ(d.feed(0xA0), "\xE4\xBD\xA0");
  EXPECT_EQ(d.feed('a'), "a");
  EXPECT_EQ(d.feed(0xF0), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");  // an unfinished character ends as U+FFFD, like decode
  EXPECT_EQ(d.feed('b'), "b");           // a new stream after flush
  EXPECT_EQ(d.feed(-5), "");             // unknown ids are skipped, as in decode
  EXPECT_EQ(d.flush(), "");
}

}  // namespace
}  // namespace m3
