// m3serve tokenize / detokenize: line-oriented JSON front ends to the tokenizer.
//   m3serve tokenize --model-path DIR     stdin: one JSON string per line
//                                         stdout: one JSON array of ids per line (no special
//                                         tokens added; added tokens in the text are matched)
//   m3serve detokenize --model-path DIR   stdin: one JSON array of ids per line
//                                         stdout: one JSON string per line (special tokens kept)
// A malformed line is reported on stderr with its line number and the command exits with 1.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace m3::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kTokenizeUsage =
    "usage: m3serve tokenize --model-path DIR\n\n"
    "Reads JSON strings, one per line, on stdin; writes one JSON array of token ids per line\n"
    "(no special tokens added). DIR holds tokenizer.json (and tokenizer_config.json).\n";
constexpr const char* kDetokenizeUsage =
    "usage: m3serve detokenize --model-path DIR\n\n"
    "Reads JSON arrays of token ids, one per line, on stdin; writes one JSON string per line\n"
    "(special tokens kept). DIR holds tokenizer.json (and tokenizer_config.json).\n";

// Parses --model-path; returns -1 to continue, else an exit code.
int parse_args(const std::vector<std::string>& args, const char* usage, std::string* model_path) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    if (a == "--model-path" && i + 1 < args.size()) {
      *model_path = args[++i];
    } else if (a.rfind("--model-path=", 0) == 0) {
      *model_path = a.substr(std::string("--model-path=").size());
    } else {
      std::fprintf(stderr, "error: unexpected argument '%s'\n%s", a.c_str(), usage);
      return 2;
    }
  }
  if (model_path->empty()) {
    std::fprintf(stderr, "error: --model-path is required\n%s", usage);
    return 2;
  }
  return -1;
}

int run(const std::vector<std::string>& args, bool tokenize) {
  std::string model_path;
  if (int rc = parse_args(args, tokenize ? kTokenizeUsage : kDetokenizeUsage, &model_path);
      rc >= 0) {
    return rc;
  }
  auto tok = Tokenizer::load(model_path);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "error: %s\n", tok.status().to_string().c_str());
    return 1;
  }
  std::ios::sync_with_stdio(false);
  std::string line, out;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    json j = json::parse(line, nullptr, false);
    out.clear();
    if (tokenize) {
      if (j.is_discarded() || !j.is_string()) {
        std::cout.flush();
        std::fprintf(stderr, "error: stdin line %zu is not a JSON string\n", line_no);
        return 1;
      }
      std::vector<int32_t> ids = tok->encode(j.get_ref<const std::string&>(), false);
      out.push_back('[');
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out.push_back(',');
        out += std::to_string(ids[i]);
      }
      out.push_back(']');
    } else {
      std::vector<int32_t> ids;
      bool ok = !j.is_discarded() && j.is_array();
      for (size_t i = 0; ok && i < j.size(); ++i) {
        ok = j[i].is_number_integer() && j[i].get<int64_t>() >= INT32_MIN &&
             j[i].get<int64_t>() <= INT32_MAX;
        if (ok) ids.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
      }
      if (!ok) {
        std::cout.flush();
        std::fprintf(stderr, "error: stdin line %zu is not a JSON array of token ids\n", line_no);
        return 1;
      }
      out = json(tok->decode(ids, false)).dump(-1, ' ', false, json::error_handler_t::replace);
    }
    out.push_back('\n');
    std::cout << out;
  }
  std::cout.flush();
  return 0;
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& args) { return run(args, true); }

int cmd_detokenize(const std::vector<std::string>& args) { return run(args, false); }

}  // namespace m3::cli
