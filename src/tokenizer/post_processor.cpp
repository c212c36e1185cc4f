#include "tokenizer/post_processor.h"

#include <nlohmann/json.hpp>
#include <string>

namespace m3::tok {
namespace {

using json = nlohmann::json;

Result<int32_t> pair_id(const json& j, const std::string& where) {
  // ["[CLS]", 101]
  if (!j.is_array() || j.size() != 2 || !j[1].is_number_integer()) {
    return invalid_argument("tokenizer.json: post_processor " + where + " must be [token, id]");
  }
  return j[1].get<int32_t>();
}

}  // namespace

Result<PostProcessor> PostProcessor::from_json(const json& j) {
  PostProcessor pp;
  if (j.is_null()) return pp;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return invalid_argument("tokenizer.json: post_processor without a 'type'");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return pp;
  if (type == "Sequence") {
    for (const json& sub : j.value("processors", json::array())) {
      M3_ASSIGN_OR_RETURN(PostProcessor p, from_json(sub));
      pp.templates_.insert(pp.templates_.end(), p.templates_.begin(), p.templates_.end());
    }
    return pp;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    M3_ASSIGN_OR_RETURN(int32_t cls, pair_id(j.value("cls", json()), type + ".cls"));
    M3_ASSIGN_OR_RETURN(int32_t sep, pair_id(j.value("sep", json()), type + ".sep"));
    pp.templates_.push_back(Template{{cls}, {sep}});
    return pp;
  }
  if (type == "TemplateProcessing") {
    const json& single = j.value("single", json::array());
    const json& specials = j.value("special_tokens", json::object());
    Template t;
    bool seen_sequence = false;
    for (const json& item : single) {
      if (item.contains("Sequence")) {
        if (seen_sequence) {
          return invalid_argument("tokenizer.json: TemplateProcessing.single has two sequences");
        }
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id")) {
        return invalid_argument("tokenizer.json: TemplateProcessing.single item is neither "
                                "Sequence nor SpecialToken");
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (!specials.contains(name) || !specials[name].contains("ids")) {
        return invalid_argument("tokenizer.json: TemplateProcessing special token '" + name +
                                "' is missing from special_tokens");
      }
      auto& dst = seen_sequence ? t.suffix : t.prefix;
      for (const json& id : specials[name]["ids"]) dst.push_back(id.get<int32_t>());
    }
    if (!seen_sequence) {
      return invalid_argument("tokenizer.json: TemplateProcessing.single has no Sequence");
    }
    pp.templates_.push_back(std::move(t));
    return pp;
  }
  return unimplemented("tokenizer.json: post_processor type '" + type + "' is not supported");
}

std::vector<int32_t> PostProcessor::apply(std::vector<int32_t> ids, bool add_special_tokens) const {
  if (!add_special_tokens) return ids;
  for (const Template& t : templates_) {
    if (t.prefix.empty() && t.suffix.empty()) continue;
    std::vector<int32_t> out;
    out.reserve(ids.size() + t.prefix.size() + t.suffix.size());
    out.insert(out.end(), t.prefix.begin(), t.prefix.end());
    out.insert(out.end(), ids.begin(), ids.end());
    out.insert(out.end(), t.suffix.begin(), t.suffix.end());
    ids.swap(out);
  }
  return ids;
}

}  // namespace m3::tok
