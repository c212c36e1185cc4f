// Normalizers from tokenizer.json ("normalizer"): NFC, NFKC, NFD, NFKD, Lowercase, Replace,
// Prepend, Strip, StripAccents, Sequence. Each rewrites a (valid UTF-8) string in place, with HF
// tokenizers' semantics. Offsets are not tracked: encode() only returns ids.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace m3::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

// Builds a normalizer from its JSON object; an unsupported type is kUnimplemented, naming it.
Result<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& j);

}  // namespace m3::tok
