#include "sample/sampling_params.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace m3 {

namespace {

template <typename T>
Status read_number(const nlohmann::json& j, const char* key, std::string_view source, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) {
    return invalid_argument(std::string(source) + ": field \"" + key + "\" is not a number");
  }
  *out = it->get<T>();
  return Status::ok();
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Result<GenerationDefaults> parse_generation_config(std::string_view json_text,
                                                   std::string_view source) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument(std::string(source) + ": not a JSON object");
  }
  GenerationDefaults d;
  M3_RETURN_IF_ERROR(read_number(j, "temperature", source, &d.temperature));
  M3_RETURN_IF_ERROR(read_number(j, "top_p", source, &d.top_p));
  M3_RETURN_IF_ERROR(read_number(j, "top_k", source, &d.top_k));
  M3_RETURN_IF_ERROR(read_number(j, "min_p", source, &d.min_p));
  M3_RETURN_IF_ERROR(read_number(j, "repetition_penalty", source, &d.repetition_penalty));
  M3_RETURN_IF_ERROR(read_number(j, "max_new_tokens", source, &d.max_new_tokens));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      d.eos_token_ids.push_back(it->get<int32_t>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer()) {
          return invalid_argument(std::string(source) +
                                  ": eos_token_id list holds a non-integer");
        }
        d.eos_token_ids.push_back(e.get<int32_t>());
      }
    } else {
      return invalid_argument(std::string(source) + ": eos_token_id is neither int nor list");
    }
  }
  return d;
}

Result<GenerationDefaults> load_generation_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_generation_config(ss.str(), path);
}

SamplingParams default_sampling_params(const GenerationDefaults& d) {
  SamplingParams p;
  p.temperature = d.temperature;
  p.top_p = d.top_p;
  p.top_k = d.top_k;
  p.min_p = d.min_p;
  p.repetition_penalty = d.repetition_penalty;
  p.max_tokens = d.max_new_tokens;
  return p;
}

Status validate_sampling_params(const SamplingParams& p, int32_t vocab_size) {
  auto bad = [](const char* name, double v, const char* range) {
    return invalid_argument(std::string(name) + " = " + num(v) + " is not in " + range);
  };
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return bad("temperature", p.temperature, "[0, inf)");
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", p.top_p, "(0, 1]");
  if (p.top_k < -1) return bad("top_k", p.top_k, "{-1, 0} or [1, vocab]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", p.min_p, "[0, 1]");
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return bad("repetition_penalty", p.repetition_penalty, "(0, inf)");
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return bad("presence_penalty", p.presence_penalty, "[-2, 2]");
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty", p.frequency_penalty, "[-2, 2]");
  }
  for (const auto& [tok, bias] : p.logit_bias) {
    if (tok < 0 || tok >= vocab_size) {
      return invalid_argument("logit_bias token id " + std::to_string(tok) +
                              " is not in [0, " + std::to_string(vocab_size) + ")");
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return invalid_argument("logit_bias for token " + std::to_string(tok) + " = " + num(bias) +
                              " is not in [-100, 100]");
    }
  }
  if (p.n < 1) return bad("n", p.n, "[1, inf)");
  for (const auto& s : p.stop) {
    if (s.empty()) return invalid_argument("stop contains an empty string");
  }
  for (int32_t t : p.stop_token_ids) {
    if (t < 0 || t >= vocab_size) {
      return invalid_argument("stop_token_ids entry " + std::to_string(t) + " is not in [0, " +
                              std::to_string(vocab_size) + ")");
    }
  }
  if (p.max_tokens == 0 || p.max_tokens < -1) {
    return bad("max_tokens", p.max_tokens, "[1, inf) (or unset)");
  }
  if (p.min_tokens < 0) return bad("min_tokens", p.min_tokens, "[0, inf)");
  if (p.max_tokens > 0 && p.min_tokens > p.max_tokens) {
    return invalid_argument("min_tokens = " + std::to_string(p.min_tokens) +
                            " is greater than max_tokens = " + std::to_string(p.max_tokens));
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return bad("top_logprobs", p.top_logprobs, "[0, 20]");
  }
  return Status::ok();
}

}  // namespace m3
