// Post-processors from tokenizer.json ("post_processor"), for the special tokens that
// encode(text, add_special_tokens=true) adds: TemplateProcessing (single sequence), BertProcessing,
// RobertaProcessing, ByteLevel (ids unchanged) and Sequence. Pairs are not supported (encode takes
// one text).
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace m3::tok {

class PostProcessor {
 public:
  static Result<PostProcessor> from_json(const nlohmann::json& j);

  // ids of the text -> final ids (the text's ids untouched when !add_special_tokens).
  std::vector<int32_t> apply(std::vector<int32_t> ids, bool add_special_tokens) const;

 private:
  // One template: special ids before and after the sequence, applied in order.
  struct Template {
    std::vector<int32_t> prefix, suffix;
  };
  std::vector<Template> templates_;
};

}  // namespace m3::tok
