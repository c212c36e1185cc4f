// Request data nested as deeply as the server admits (core/json_depth.h) through the chat
// template engine: it renders or fails with a status, and never exhausts the stack. Templates
// walk tool schemas both with tojson and with recursive macros.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "core/json_depth.h"

namespace m3 {
namespace {

using json = nlohmann::ordered_json;

// {"type":"object","properties":{"a": <levels more>}} down to a leaf.
json nested_schema(int levels) {
  json leaf = {{"type", "string"}, {"description", "leaf"}};
  for (int i = 0; i < levels; ++i) {
    leaf = json{{"type", "object"}, {"properties", {{"a", leaf}}}};
  }
  return leaf;
}

json request_with_schema(int levels) {
  return {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
          {"tools", json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "f"}, {"parameters", nested_schema(levels)}}}}})}};
}

TEST(DeepInput, BundledTemplateRendersTheDeepestAdmittedSchema) {
  auto tmpl = load_chat_template(std::string(M3_REPO_ROOT) + "/models/m3-tiny");
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().message();
  // Each schema level is two JSON levels; the body adds four around the parameters.
  const int levels = (kMaxJsonDepth - 6) / 2;
  json req = request_with_schema(levels);
  ASSERT_FALSE(json_too_deep(req.dump()));
  auto out = render_chat(*tmpl, req);
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_NE(out->find("leaf"), std::string::npos);
}

TEST(DeepInput, RecursiveMacroOverADeepSchemaFailsCleanly) {
  // A template that renders a schema with a recursive macro, as several model templates do.
  const std::string source = R"({%- macro walk(s) -%}
{{ s.type }}{% if s.properties is defined %}({% for k, v in s.properties.items() %}{{ k }}:{{ walk(v) }}{% endfor %}){% endif %}
{%- endmacro -%}
{%- for t in tools %}{{ walk(t.function.parameters) }}{% endfor %}{{ messages[0].content }})";
  auto tmpl = make_chat_template(source, "walk.jinja", json::object());
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().message();
  auto shallow = render_chat(*tmpl, request_with_schema(3));
  ASSERT_TRUE(shallow.is_ok()) << shallow.status().message();
  EXPECT_EQ(*shallow, "object(a:object(a:object(a:string)))hi");
  // The deepest schema a request can carry renders.
  auto admitted = render_chat(*tmpl, request_with_schema((kMaxJsonDepth - 6) / 2));
  ASSERT_TRUE(admitted.is_ok()) << admitted.status().message();
  // Deeper than the engine's macro call limit (possible only for callers that skip the server's
  // JSON limit): a resource error, not a crash.
  auto deep = render_chat(*tmpl, request_with_schema(200));
  ASSERT_FALSE(deep.is_ok());
  EXPECT_EQ(deep.status().code(), StatusCode::kResourceExhausted) << deep.status().message();
}

TEST(DeepInput, ToolCallArgumentsStringPastTheLimitIsRefused) {
  auto tmpl = load_chat_template(std::string(M3_REPO_ROOT) + "/models/m3-tiny");
  ASSERT_TRUE(tmpl.is_ok());
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  json req = {{"messages",
               json::array({{{"role", "user"}, {"content", "hi"}},
                            {{"role", "assistant"},
                             {"content", ""},
                             {"tool_calls", json::array({{{"type", "function"},
                                                          {"function",
                                                           {{"name", "f"},
                                                            {"arguments", deep}}}}})}}})}};
  auto out = render_chat(*tmpl, req);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("nests more than"), std::string::npos);
}

}  // namespace
}  // namespace m3
