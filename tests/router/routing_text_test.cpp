#include "router/routing_text.h"

#include <gtest/gtest.h>

namespace m3::router {
namespace {

TEST(RoutingText, ChatGrowsAsTheConversationGrows) {
  const std::string turn1 =
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},)"
      R"({"role":"user","content":"hi"}]})";
  const std::string turn2 =
      R"({"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},)"
      R"({"role":"user","content":"hi"},{"role":"assistant","content":"hello"},)"
      R"({"role":"user","content":[{"type":"text","text":"how are"},{"type":"text","text":" you"}]}]})";
  const std::string a = routing_text("/v1/chat/completions", turn1);
  const std::string b = routing_text("/v1/chat/completions", turn2);
  EXPECT_EQ(a, "system: be brief\nuser: hi\n");
  EXPECT_EQ(b, a + "assistant: hello\nuser: how are you\n");
  // Sampling fields do not change the text.
  EXPECT_EQ(b.rfind(a, 0), 0u);
}

TEST(RoutingText, CompletionsPromptStringOrTokenIds) {
  EXPECT_EQ(routing_text("/v1/completions", R"({"prompt":"once upon"})"), "once upon");
  EXPECT_EQ(routing_text("/v1/completions", R"({"prompt":[1,22,333]})"), "1 22 333 ");
  EXPECT_EQ(routing_text("/v1/completions", R"({"prompt":[[5,6],[7]]})"), "5 6 ");
  EXPECT_EQ(routing_text("/v1/completions", R"({"prompt":["first","second"]})"), "first");
}

TEST(RoutingText, OtherRoutesAndBadBodiesUseTheRawBody) {
  EXPECT_EQ(routing_text("/tokenize", R"({"prompt":"x"})"), R"({"prompt":"x"})");
  EXPECT_EQ(routing_text("/v1/completions", "not json"), "not json");
  EXPECT_EQ(routing_text("/v1/chat/completions", R"({"model":"m"})"), "");
}

}  // namespace
}  // namespace m3::router
