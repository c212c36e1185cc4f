#include "chat/parsers/tool_parser_minimax_m3.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "chat/parsers/markers_minimax_m3.h"
#include "core/json_depth.h"

namespace m3::chat {

using json = nlohmann::json;
using namespace minimax_m3;

namespace {

// A tag longer than this after a namespace marker is not a tag: the marker is dropped and the
// text after it is treated as literal. Bounded so a stray marker cannot make us buffer forever.
constexpr size_t kMaxTagLength = 512;

// The namespace marker up to its own '>': where it appears inside a would-be tag, a second marker
// starts there (process()).
constexpr std::string_view kNsBeforeGt = kNs.substr(0, kNs.find('>'));

bool is_space(char c) {
  return WsTrimmer::is_space(c);
}

bool all_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return is_space(c); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// JSON string-content escaping, byte by byte, so that escaping a text in pieces equals escaping it
// whole (the streaming guarantee). Non-ASCII bytes pass through (UTF-8 output, like json::dump).
void escape_into(std::string_view text, std::string& out) {
  static const char* kHex = "0123456789abcdef";
  for (char ch : text) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  escape_into(s, out);
  out += '"';
  return out;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Every JSON type a schema allows (type, type lists, anyOf/oneOf/allOf, enum, const, implied).
void collect_types(const json* s, std::set<std::string>& types, int depth = 0) {
  if (!s || !s->is_object() || depth > 8) return;
  if (auto it = s->find("type"); it != s->end()) {
    if (it->is_string()) types.insert(it->get<std::string>());
    if (it->is_array())
      for (const auto& t : *it)
        if (t.is_string()) types.insert(t.get<std::string>());
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (auto it = s->find(key); it != s->end() && it->is_array())
      for (const auto& sub : *it) collect_types(&sub, types, depth + 1);
  }
  auto add_value_type = [&](const json& v) {
    if (v.is_string())
      types.insert("string");
    else if (v.is_boolean())
      types.insert("boolean");
    else if (v.is_number_integer() || v.is_number_unsigned())
      types.insert("integer");
    else if (v.is_number())
      types.insert("number");
    else if (v.is_null())
      types.insert("null");
    else if (v.is_object())
      types.insert("object");
    else if (v.is_array())
      types.insert("array");
  };
  if (auto it = s->find("enum"); it != s->end() && it->is_array())
    for (const auto& v : *it) add_value_type(v);
  if (auto it = s->find("const"); it != s->end()) add_value_type(*it);
  if (!s->contains("type")) {
    if (s->contains("properties")) types.insert("object");
    if (s->contains("items")) types.insert("array");
  }
}

bool is_pure_string(const json* s) {
  std::set<std::string> t;
  collect_types(s, t);
  t.erase("null");
  return t.size() == 1 && *t.begin() == "string";
}

// The member of a (possibly anyOf) schema that describes a value of JSON type `want`.
const json* branch_of_type(const json* s, const std::string& want, int depth = 0) {
  if (!s || !s->is_object() || depth > 8) return nullptr;
  std::set<std::string> own;
  if (auto it = s->find("type"); it != s->end()) {
    if (it->is_string()) own.insert(it->get<std::string>());
    if (it->is_array())
      for (const auto& t : *it)
        if (t.is_string()) own.insert(t.get<std::string>());
  } else {
    if (s->contains("properties")) own.insert("object");
    if (s->contains("items")) own.insert("array");
  }
  if (own.count(want)) return s;
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (auto it = s->find(key); it != s->end() && it->is_array())
      for (const auto& sub : *it)
        if (const json* b = branch_of_type(&sub, want, depth + 1)) return b;
  }
  return nullptr;
}

std::optional<json> parse_json(std::string_view t) {
  // Model output is text like any other: too deep to walk safely is not JSON to us.
  if (t.empty() || json_too_deep(t)) return std::nullopt;
  json j = json::parse(t.begin(), t.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

}  // namespace

std::string minimax_m3_convert_scalar(std::string_view raw, const json* schema) {
  std::string_view t = trim(raw);
  std::set<std::string> types;
  collect_types(schema, types);
  std::optional<json> parsed = parse_json(t);
  std::string low = lower(t);

  for (const char* type : {"integer", "number", "boolean", "null", "object", "array"}) {
    if (!types.count(type)) continue;
    std::string_view ty = type;
    if (ty == "integer" && parsed && parsed->is_number()) {
      if (parsed->is_number_integer() || parsed->is_number_unsigned()) return dump(*parsed);
      double d = parsed->get<double>();
      // "1400.0" for an integer parameter (seen in real outputs) is the integer 1400.
      if (d == static_cast<double>(static_cast<int64_t>(d)) && d > -9.2e18 && d < 9.2e18)
        return std::to_string(static_cast<int64_t>(d));
    }
    if (ty == "number" && parsed && parsed->is_number()) return dump(*parsed);
    if (ty == "boolean" && (low == "true" || low == "false")) return low;
    if (ty == "null" && (low == "null" || low == "none")) return "null";
    if (ty == "object" && parsed && parsed->is_object()) return dump(*parsed);
    if (ty == "array" && parsed && parsed->is_array()) return dump(*parsed);
  }
  if (types.count("string")) return json_string(raw);
  // No schema, or the text matches none of the allowed types: JSON if it parses, else a string.
  if (parsed) return dump(*parsed);
  if (low == "true" || low == "false") return low;
  if (low == "none") return "null";
  return json_string(raw);
}

MiniMaxM3ToolParser::MiniMaxM3ToolParser(const json& tools, bool trim_content)
    : trim_content_(trim_content) {
  if (!tools.is_array()) return;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) continue;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) continue;
    auto params = fn->find("parameters");
    schemas_[name->get<std::string>()] =
        (params != fn->end() && params->is_object()) ? *params : json::object();
  }
}

ToolParseDelta MiniMaxM3ToolParser::feed(std::string_view text) {
  ToolParseDelta out;
  buf_.append(text);
  process(out, /*final=*/false);
  return out;
}

ToolParseDelta MiniMaxM3ToolParser::finish() {
  ToolParseDelta out;
  process(out, /*final=*/true);
  if (mode_ == Mode::kInvoke) close_all(out);
  content_trim_.boundary();
  return out;
}

void MiniMaxM3ToolParser::process(ToolParseDelta& out, bool final) {
  size_t pos = 0;
  while (pos < buf_.size()) {
    std::string_view rest = std::string_view(buf_).substr(pos);
    size_t p = rest.find(kNs);
    if (p == std::string_view::npos) {
      size_t hold = final ? 0 : partial_suffix(rest, kNs);
      on_literal(rest.substr(0, rest.size() - hold), out);
      pos += rest.size() - hold;
      break;
    }
    on_literal(rest.substr(0, p), out);
    pos += p;
    std::string_view after = rest.substr(p + kNs.size());
    if (after.empty()) {
      if (final) pos = buf_.size();  // a trailing bare marker is dropped
      break;
    }
    if (after[0] != '<') {  // a marker not followed by a tag: drop the marker
      pos += kNs.size();
      continue;
    }
    size_t gt = after.find('>');
    if (gt == std::string_view::npos ? after.size() > kMaxTagLength : gt > kMaxTagLength) {
      pos += kNs.size();  // too long to be a tag: drop the marker, the rest is literal
      continue;
    }
    if (gt == std::string_view::npos) {
      if (final) pos = buf_.size();  // a tag truncated by the end of output is dropped
      break;                         // otherwise wait for the rest of the tag
    }
    // A tag never contains a marker: in "marker<marker</city>" (seen from a small model) the first
    // marker and its '<' are stray, and the tag is the one the inner marker starts. (The marker
    // itself holds a '>', so without this its first half would be read as a tag name.)
    if (after.substr(1, gt).find(kNsBeforeGt) != std::string_view::npos) {
      pos += kNs.size() + 1;
      continue;
    }
    std::string_view raw = after.substr(0, gt + 1);
    pos += kNs.size() + raw.size();

    Tag tag;
    tag.raw = std::string(raw);
    std::string_view inner = raw.substr(1, raw.size() - 2);
    if (!inner.empty() && inner[0] == '/') {
      tag.closing = true;
      inner.remove_prefix(1);
    }
    if (!inner.empty() && inner.back() == '/') {
      tag.self_closing = true;
      inner.remove_suffix(1);
    }
    inner = trim(inner);
    size_t name_end = 0;
    while (name_end < inner.size() && !is_space(inner[name_end])) ++name_end;
    tag.name = std::string(inner.substr(0, name_end));
    std::string_view attrs = inner.substr(name_end);
    if (size_t a = attrs.find("name"); a != std::string_view::npos) {
      std::string_view v = trim(attrs.substr(a + 4));
      if (!v.empty() && v[0] == '=') {
        v = trim(v.substr(1));
        if (!v.empty() && (v[0] == '"' || v[0] == '\'')) {
          char q = v[0];
          size_t end = v.find(q, 1);
          tag.name_attr =
              std::string(v.substr(1, end == std::string_view::npos ? v.size() - 1 : end - 1));
        } else {
          size_t end = 0;
          while (end < v.size() && !is_space(v[end])) ++end;
          tag.name_attr = std::string(v.substr(0, end));
        }
      }
    }
    on_tag(tag, out);
  }
  buf_.erase(0, pos);
}

void MiniMaxM3ToolParser::emit_content(std::string_view text, ToolParseDelta& out) {
  if (trim_content_) {
    content_trim_.push(text, out.content);
  } else {
    out.content.append(text);
  }
}

void MiniMaxM3ToolParser::emit_args(std::string_view text, ToolParseDelta& out) {
  if (text.empty()) return;
  int index = num_calls_ - 1;
  if (out.calls.empty() || out.calls.back().index != index) {
    out.calls.push_back(ToolCallDelta{index, false, "", ""});
  }
  out.calls.back().arguments.append(text);
}

void MiniMaxM3ToolParser::on_literal(std::string_view text, ToolParseDelta& out) {
  if (text.empty()) return;
  if (mode_ == Mode::kContent) {
    emit_content(text, out);
    return;
  }
  if (mode_ == Mode::kBlock || frames_.empty()) return;  // whitespace between invokes
  Frame& f = frames_.back();
  switch (f.kind) {
    case FrameKind::kInvoke:
    case FrameKind::kObject:
    case FrameKind::kArray:
      return;  // whitespace (or junk) between members
    case FrameKind::kUndecided:
      f.text.append(text);
      if (!all_space(f.text)) f.kind = FrameKind::kScalar;
      return;
    case FrameKind::kScalar:
      f.text.append(text);
      return;
    case FrameKind::kString: {
      std::string esc;
      escape_into(text, esc);
      emit_args(esc, out);
      return;
    }
  }
}

const json* MiniMaxM3ToolParser::resolve(const json* s) const {
  // Local references ("#/$defs/X", "#/definitions/X") against the call's parameters schema.
  for (int i = 0; i < 8 && s && s->is_object(); ++i) {
    auto ref = s->find("$ref");
    if (ref == s->end() || !ref->is_string() || !root_schema_) return s;
    std::string r = ref->get<std::string>();
    if (r.rfind("#/", 0) != 0) return s;
    try {
      const json& target = root_schema_->at(json::json_pointer(r.substr(1)));
      s = &target;
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  return s;
}

void MiniMaxM3ToolParser::start_invoke(const std::string& name, ToolParseDelta& out) {
  int index = num_calls_++;
  out.calls.push_back(ToolCallDelta{index, true, name, "{"});
  auto it = schemas_.find(name);
  root_schema_ = it == schemas_.end() ? nullptr : &it->second;
  frames_.push_back(Frame{FrameKind::kInvoke, "invoke", root_schema_, false, ""});
  mode_ = Mode::kInvoke;
}

void MiniMaxM3ToolParser::push_value(const std::string& tag, const json* schema,
                                     ToolParseDelta& out) {
  schema = resolve(schema);
  if (is_pure_string(schema)) {
    emit_args("\"", out);
    frames_.push_back(Frame{FrameKind::kString, tag, schema, false, ""});
  } else {
    frames_.push_back(Frame{FrameKind::kUndecided, tag, schema, false, ""});
  }
}

void MiniMaxM3ToolParser::close_top(ToolParseDelta& out) {
  Frame f = std::move(frames_.back());
  frames_.pop_back();
  switch (f.kind) {
    case FrameKind::kInvoke:
    case FrameKind::kObject:
      emit_args("}", out);
      break;
    case FrameKind::kArray:
      emit_args("]", out);
      break;
    case FrameKind::kString:
      emit_args("\"", out);
      break;
    case FrameKind::kUndecided:
    case FrameKind::kScalar:
      emit_args(minimax_m3_convert_scalar(f.text, f.schema), out);
      break;
  }
  if (f.kind == FrameKind::kInvoke) {
    root_schema_ = nullptr;
    mode_ = implicit_block_ ? Mode::kContent : Mode::kBlock;
    implicit_block_ = false;
  }
}

void MiniMaxM3ToolParser::close_all(ToolParseDelta& out) {
  while (!frames_.empty()) close_top(out);
}

void MiniMaxM3ToolParser::on_tag(const Tag& tag, ToolParseDelta& out) {
  const bool open = !tag.closing;
  if (mode_ == Mode::kContent) {
    if (open && tag.name == "tool_call") {
      content_trim_.boundary();
      mode_ = Mode::kBlock;
    } else if (open && tag.name == "invoke") {
      content_trim_.boundary();
      implicit_block_ = true;
      start_invoke(tag.name_attr, out);
      if (tag.self_closing) close_all(out);
    }
    return;  // any other tag in content is dropped markup
  }
  if (mode_ == Mode::kBlock) {
    if (open && tag.name == "invoke") {
      start_invoke(tag.name_attr, out);
      if (tag.self_closing) close_all(out);
    } else if (!open && tag.name == "tool_call") {
      mode_ = Mode::kContent;
    }
    return;
  }

  // Inside an invoke.
  if (tag.name == "invoke" || tag.name == "tool_call") {
    bool implicit = implicit_block_;
    close_all(out);  // closes the invoke (and anything left open in it)
    if (open && tag.name == "invoke") {
      implicit_block_ = implicit;
      start_invoke(tag.name_attr, out);
      if (tag.self_closing) close_all(out);
    } else if (open) {
      mode_ = Mode::kBlock;  // <tool_call> inside an invoke: a new block
    } else if (tag.name == "tool_call") {
      mode_ = Mode::kContent;
    }
    return;
  }
  if (open) {
    size_t depth = frames_.size();
    on_open_in_invoke(tag, out);
    if (tag.self_closing && frames_.size() > depth) close_top(out);  // <key/>: an empty value
    return;
  }
  // A closing tag: close up to the innermost frame it matches; unmatched ones are literal text in
  // a string or scalar value and ignored elsewhere.
  for (size_t i = frames_.size(); i-- > 1;) {
    if (frames_[i].tag == tag.name) {
      while (frames_.size() > i) close_top(out);
      return;
    }
  }
  on_literal(tag.raw, out);
}

void MiniMaxM3ToolParser::on_open_in_invoke(const Tag& tag, ToolParseDelta& out) {
  Frame& f = frames_.back();
  if (f.kind == FrameKind::kString || f.kind == FrameKind::kScalar) {
    on_literal(tag.raw, out);  // a tag inside a text value is text
    return;
  }
  if (f.kind == FrameKind::kUndecided) {
    // The first thing in the value is a tag: a nested object, or an array of <item>s.
    std::set<std::string> types;
    collect_types(f.schema, types);
    bool arr = types.count("array") && !types.count("object");
    bool obj = types.count("object") && !types.count("array");
    bool is_array = arr || (!obj && tag.name == "item");
    f.kind = is_array ? FrameKind::kArray : FrameKind::kObject;
    f.schema = branch_of_type(f.schema, is_array ? "array" : "object");
    f.text.clear();
    emit_args(is_array ? "[" : "{", out);
  }
  Frame& parent = frames_.back();
  const json* child_schema = nullptr;
  if (parent.kind == FrameKind::kArray) {
    if (const json* s = resolve(parent.schema); s && s->is_object()) {
      auto it = s->find("items");
      if (it != s->end() && it->is_object()) child_schema = &*it;
    }
    emit_args(parent.has_members ? "," : "", out);
  } else {
    const json* s = resolve(parent.schema);
    if (s && s->is_object()) {
      auto props = s->find("properties");
      if (props != s->end() && props->is_object()) {
        auto p = props->find(tag.name);
        if (p != props->end()) child_schema = &*p;
      }
      if (!child_schema) {
        auto ap = s->find("additionalProperties");
        if (ap != s->end() && ap->is_object()) child_schema = &*ap;
      }
    }
    std::string key = parent.has_members ? "," : "";
    key += json_string(tag.name);
    key += ':';
    emit_args(key, out);
  }
  parent.has_members = true;
  push_value(tag.name, child_schema, out);
}

}  // namespace m3::chat
