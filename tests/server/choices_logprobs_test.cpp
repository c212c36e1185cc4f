// n > 1 and logprobs over HTTP against the fake backend: n independent choices (indices, usage
// summed over choices with the prompt once, per-choice seeds that differ but reproduce, cancel
// of every choice on disconnect), and OpenAI's logprobs shapes for chat and completions,
// streaming and not.
#include <cmath>
#include <map>

#include "server/handlers/generation.h"
#include "server/handlers/logprobs_json.h"
#include "test_client.h"

namespace m3::server {
namespace {

using namespace testing_http;

std::string completion_body(const std::string& prompt, bool stream, const std::string& extra) {
  json b = {{"model", "m3-tiny"}, {"prompt", prompt}, {"stream", stream}, {"max_tokens", 100}};
  std::string s = b.dump();
  if (!extra.empty()) s = s.substr(0, s.size() - 1) + "," + extra + "}";
  return s;
}

TEST_F(ServerTest, ChatNChoicesNonStreaming) {
  start();
  Client c(port());
  c.send("POST", "/v1/chat/completions", chat_body("hi"));
  Response one = c.read();
  ASSERT_EQ(one.status, 200) << one.body;
  json u1 = json::parse(one.body)["usage"];
  c.send("POST", "/v1/chat/completions", chat_body("hi", false, R"("n":3)"));
  Response r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["message"]["content"], "Hello from the fake backend.");
    EXPECT_EQ(j["choices"][i]["finish_reason"], "stop");
    EXPECT_TRUE(j["choices"][i]["logprobs"].is_null());
  }
  // The prompt once, the completions summed.
  EXPECT_EQ(j["usage"]["prompt_tokens"], u1["prompt_tokens"]);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 * u1["completion_tokens"].get<int>());
  EXPECT_EQ(j["usage"]["total_tokens"],
            u1["prompt_tokens"].get<int>() + 3 * u1["completion_tokens"].get<int>());
}

TEST_F(ServerTest, ChatNChoicesStreaming) {
  start();
  Client c(port());
  c.send("POST", "/v1/chat/completions",
         chat_body("hi", true, R"("n":4,"stream_options":{"include_usage":true})"));
  Response r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  bool done = false;
  auto events = sse_events(r.body, &done);
  EXPECT_TRUE(done);
  std::map<int, std::string> text;
  std::map<int, int> roles, finishes;
  json usage;
  for (const auto& e : events) {
    if (e.contains("usage") && !e["usage"].is_null()) {
      EXPECT_TRUE(e["choices"].empty());
      usage = e["usage"];
      continue;
    }
    ASSERT_EQ(e["choices"].size(), 1u);
    const json& ch = e["choices"][0];
    int i = ch["index"];
    EXPECT_EQ(finishes[i], 0) << "a chunk after choice " << i << " finished";
    if (ch["delta"].contains("role")) ++roles[i];
    if (ch["delta"].contains("content")) text[i] += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) ++finishes[i];
  }
  ASSERT_EQ(text.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(text[i], "Hello from the fake backend.") << i;
    EXPECT_EQ(roles[i], 1) << i;
    EXPECT_EQ(finishes[i], 1) << i;
  }
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"].get<int>() % 4, 0);
  EXPECT_GT(usage["completion_tokens"].get<int>(), 0);
}

TEST_F(ServerTest, SeededChoicesDifferAndReproduce) {
  start();
  Client c(port());
  auto run = [&](const std::string& extra) {
    c.send("POST", "/v1/chat/completions", chat_body("FAKE_ECHO_SEED", false, extra));
    Response r = c.read();
    EXPECT_EQ(r.status, 200) << r.body;
    std::vector<std::string> out;
    const json j = json::parse(r.body);
    for (const auto& ch : j["choices"]) out.push_back(ch["message"]["content"]);
    return out;
  };
  auto a = run(R"("n":3,"seed":42)");
  auto b = run(R"("n":3,"seed":42)");
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b);             // reproducible
  EXPECT_EQ(a[0], "seed 42");  // choice 0 keeps the seed (n = 1 is unchanged)
  EXPECT_NE(a[0], a[1]);
  EXPECT_NE(a[1], a[2]);
  EXPECT_NE(a[0], a[2]);
  EXPECT_EQ(a[1], "seed " + std::to_string(choice_seed(42, 1)));
  EXPECT_EQ(run(R"("n":2)")[0], "seed none");
}

TEST_F(ServerTest, DisconnectCancelsEveryChoice) {
  start();
  {
    Client c(port());
    c.send("POST", "/v1/chat/completions", chat_body("FAKE_INFINITE", true, R"("n":3)"));
    c.read_some(10);
    c.close();
  }
  EXPECT_TRUE(wait_cancelled(3));
  {
    Client c(port());
    c.send("POST", "/v1/completions", completion_body("FAKE_INFINITE", false, R"("n":5)"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.close();
  }
  EXPECT_TRUE(wait_cancelled(8));
}

TEST_F(ServerTest, TooManyChoicesIs400NamingTheLimit) {
  start();
  Client c(port());
  c.send("POST", "/v1/chat/completions", chat_body("hi", false, R"("n":17)"));
  Response r = c.read();
  EXPECT_EQ(r.status, 400);
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "n");
  EXPECT_NE(e["message"].get<std::string>().find("16"), std::string::npos);
}

// A /v1/completions batch: choice index = prompt·n + i, each prompt's own output and echo, usage
// summed over the prompts, and choice i of a prompt seeded as that prompt alone would be.
TEST_F(ServerTest, CompletionBatchedPrompts) {
  start();
  Client c(port());
  auto post = [&](json body) {
    body["max_tokens"] = 100;
    c.send("POST", "/v1/completions", body.dump());
    Response r = c.read();
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  };
  const std::vector<std::string> texts = {"first", "second one", "3"};
  json prompts = json::array();
  for (const auto& t : texts) prompts.push_back("FAKE_OUTPUT_B64=" + b64(t));
  json j = post({{"prompt", prompts}, {"n", 2}, {"echo", true}});
  ASSERT_EQ(j["choices"].size(), 6u);
  int prompt_tokens = 0, completion_tokens = 0;
  for (size_t k = 0; k < texts.size(); ++k) {
    json one = post({{"prompt", prompts[k]}, {"echo", true}});
    prompt_tokens += one["usage"]["prompt_tokens"].get<int>();
    completion_tokens += 2 * one["usage"]["completion_tokens"].get<int>();
    for (int i = 0; i < 2; ++i) {
      const json& ch = j["choices"][2 * k + i];
      EXPECT_EQ(ch["index"], 2 * k + i);
      EXPECT_EQ(ch["text"], prompts[k].get<std::string>() + texts[k]) << k << " " << i;
      EXPECT_EQ(ch["text"], one["choices"][0]["text"]);
    }
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], completion_tokens);

  // Token-id prompts, streamed: every chunk names its choice, each choice finishes once.
  json ids = json::array({json::array({65, 66}), json::array({67})});
  c.send("POST", "/v1/completions",
         json({{"prompt", ids}, {"stream", true}, {"stream_options", {{"include_usage", true}}}})
             .dump());
  Response r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  bool done = false;
  std::map<int, int> finishes;
  json usage;
  for (const auto& e : sse_events(r.body, &done)) {
    if (e.contains("usage") && !e["usage"].is_null()) {
      usage = e["usage"];
      continue;
    }
    const int i = e["choices"][0]["index"];
    EXPECT_TRUE(i == 0 || i == 1) << i;
    if (!e["choices"][0]["finish_reason"].is_null()) ++finishes[i];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
  EXPECT_EQ(usage["prompt_tokens"], 3);

  // Seeds: choice i of each prompt gets choice_seed(seed, i), as for that prompt alone.
  json seeded = post({{"prompt", json::array({"FAKE_ECHO_SEED a", "FAKE_ECHO_SEED b"})},
                      {"n", 2},
                      {"seed", 7}});
  ASSERT_EQ(seeded["choices"].size(), 4u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(seeded["choices"][2 * k]["text"], "seed 7");
    EXPECT_EQ(seeded["choices"][2 * k + 1]["text"], "seed " + std::to_string(choice_seed(7, 1)));
  }
}

TEST_F(ServerTest, CompletionBatchErrorsNameThePrompt) {
  FakeBackendOptions fo;
  fo.max_waiting = 4;
  start({}, fo);
  Client c(port());
  auto error = [&](const json& body) {
    c.send("POST", "/v1/completions", body.dump());
    Response r = c.read();
    EXPECT_EQ(r.status, 400) << r.body;
    return json::parse(r.body)["error"];
  };
  EXPECT_EQ(error({{"prompt", json::array({json::array({1}), json::array({1 << 20})})}})["param"],
            "prompt[1]");
  EXPECT_EQ(error({{"prompt", json::array({"a", json::array({1})})}})["param"], "prompt[1]");
  EXPECT_EQ(error({{"prompt", json::array({"a", ""})}})["param"], "prompt[1]");
  // 3 prompts x n 2 can never all wait in a queue of 4.
  json e = error({{"prompt", json::array({"a", "b", "c"})}, {"n", 2}});
  EXPECT_EQ(e["param"], "prompt");
  EXPECT_EQ(e["code"], "n_exceeds_queue");
  EXPECT_NE(e["message"].get<std::string>().find("3 prompts"), std::string::npos) << e;
}

// continue_final_message renders the final assistant message without its end of turn and with
// no new assistant turn; truncate_prompt_tokens keeps the prompt's last tokens; skip_special_tokens
// reaches the backend for completions.
TEST_F(ServerTest, TemplateOptionsTruncationAndSpecialTokens) {
  start();
  Client c(port());
  json msgs = json::array({{{"role", "user"}, {"content", "q"}},
                           {{"role", "assistant"}, {"content", "The answer is"}}});
  auto prompt_of_last = [&]() {
    return codec_.decode(backend_->last_request().prompt_tokens, false).value();
  };
  c.send("POST", "/v1/chat/completions",
         json({{"messages", msgs}, {"continue_final_message", true}}).dump());
  Response r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  std::string continued = prompt_of_last();
  EXPECT_TRUE(continued.size() >= 13 &&
              continued.compare(continued.size() - 13, 13, "The answer is") == 0)
      << continued;
  c.send("POST", "/v1/chat/completions", json({{"messages", msgs}}).dump());
  ASSERT_EQ(c.read().status, 200);
  std::string fresh_turn = prompt_of_last();
  EXPECT_GT(fresh_turn.size(), continued.size());
  EXPECT_EQ(fresh_turn.compare(0, continued.size(), continued), 0)
      << "the continued prompt is the ordinary one cut after the final message's text";
  // /tokenize counts the same prompts.
  for (const auto& [extra, want] : {std::pair{json{{"continue_final_message", true}}, continued},
                                    std::pair{json::object(), fresh_turn}}) {
    json body = {{"messages", msgs}};
    body.update(extra);
    c.send("POST", "/tokenize", body.dump());
    Response t = c.read();
    ASSERT_EQ(t.status, 200) << t.body;
    EXPECT_EQ(json::parse(t.body)["count"], codec_.encode(want).value().size()) << extra;
  }

  c.send("POST", "/v1/completions",
         json({{"prompt", "abcdefgh"}, {"truncate_prompt_tokens", 3}, {"echo", true},
               {"max_tokens", 100}, {"skip_special_tokens", false}})
             .dump());
  r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(prompt_of_last(), "fgh");
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>().rfind("fgh", 0), 0u) << j;
  EXPECT_FALSE(backend_->last_request().skip_special_tokens);
  c.send("POST", "/v1/completions", json({{"prompt", "abc"}, {"max_tokens", 2}}).dump());
  ASSERT_EQ(c.read().status, 200);
  EXPECT_TRUE(backend_->last_request().skip_special_tokens);
}

// stream_options.continuous_usage_stats (vLLM's): every chunk carries the usage so far, its
// completion tokens never decrease and end at the final usage.
TEST_F(ServerTest, ContinuousUsageStats) {
  start();
  Client c(port());
  const std::string scripted = "FAKE_OUTPUT_B64=" + b64("abcdef") + " FAKE_TPS=2";
  c.send("POST", "/v1/chat/completions",
         chat_body(scripted, true,
                   R"("stream_options":{"include_usage":true,"continuous_usage_stats":true})"));
  Response r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  bool done = false;
  auto events = sse_events(r.body, &done);
  ASSERT_TRUE(done);
  ASSERT_GE(events.size(), 3u);
  int last = 0;
  for (const auto& e : events) {
    ASSERT_TRUE(e.contains("usage") && e["usage"].is_object()) << e;
    const int now = e["usage"]["completion_tokens"];
    EXPECT_GE(now, last);
    EXPECT_EQ(e["usage"]["total_tokens"], e["usage"]["prompt_tokens"].get<int>() + now);
    last = now;
  }
  // The last count is the whole completion, as the same request reports it unstreamed.
  c.send("POST", "/v1/chat/completions", chat_body(scripted));
  Response whole = c.read();
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(last, json::parse(whole.body)["usage"]["completion_tokens"]);
  EXPECT_GT(last, 0);
  c.send("POST", "/v1/chat/completions",
         chat_body("hi", true, R"("stream_options":{"continuous_usage_stats":"yes"})"));
  r = c.read();
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "stream_options.continuous_usage_stats");
}

// Checks one chat logprobs entry: shape, bytes, top list sorted with `top` entries, and the
// generated token (the fake backend's most likely) at its head.
void check_chat_entry(const json& e, int top) {
  ASSERT_TRUE(e["token"].is_string());
  const std::string tok = e["token"];
  json bytes = json::array();
  for (unsigned char ch : tok) bytes.push_back(static_cast<int>(ch));
  EXPECT_EQ(e["bytes"], bytes);
  ASSERT_EQ(e["top_logprobs"].size(), static_cast<size_t>(top));
  double max_p = 0;
  for (size_t k = 0; k < e["top_logprobs"].size(); ++k) {
    const json& t = e["top_logprobs"][k];
    EXPECT_TRUE(t["token"].is_string());
    EXPECT_TRUE(t["bytes"].is_array());
    if (k > 0) {
      EXPECT_GE(e["top_logprobs"][k - 1]["logprob"].get<double>(), t["logprob"].get<double>());
    }
    max_p = std::max(max_p, std::exp(t["logprob"].get<double>()));
  }
  if (top > 0) {
    EXPECT_EQ(e["top_logprobs"][0]["token"], tok);
    EXPECT_DOUBLE_EQ(std::exp(e["logprob"].get<double>()), max_p);
  }
}

TEST_F(ServerTest, ChatLogprobsNonStreaming) {
  start();
  Client c(port());
  c.send("POST", "/v1/chat/completions",
         chat_body("FAKE_OUTPUT_B64=" + b64("Hi é"), false,
                   R"("logprobs":true,"top_logprobs":3,"n":2)"));
  Response r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  int total = 0;
  for (const auto& ch : j["choices"]) {
    const json& content = ch["logprobs"]["content"];
    ASSERT_TRUE(content.is_array()) << ch.dump();
    total += static_cast<int>(content.size());
    for (const auto& e : content) check_chat_entry(e, 3);
    // The fake codec's tokens are bytes: 'H', 'i', ' ', then é's two bytes, each decoding alone
    // to U+FFFD, then EOS.
    ASSERT_GE(content.size(), 5u);
    EXPECT_EQ(content[0]["token"], "H");
    EXPECT_EQ(content[0]["bytes"], json::array({72}));
    EXPECT_EQ(content[3]["token"], "\xEF\xBF\xBD");
  }
  EXPECT_EQ(total, j["usage"]["completion_tokens"]);
  // Without top_logprobs: entries with empty top lists.
  c.send("POST", "/v1/chat/completions", chat_body("hi", false, R"("logprobs":true)"));
  r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  const json plain = json::parse(r.body);
  ASSERT_FALSE(plain["choices"][0]["logprobs"]["content"].empty());
  for (const auto& e : plain["choices"][0]["logprobs"]["content"]) check_chat_entry(e, 0);
}

TEST_F(ServerTest, ChatLogprobsStreaming) {
  start();
  Client c(port());
  c.send("POST", "/v1/chat/completions",
         chat_body("hi", true,
                   R"("logprobs":true,"top_logprobs":5,"stream_options":{"include_usage":true})"));
  Response r = c.read();
  ASSERT_EQ(r.status, 200) << r.body;
  int entries = 0, completion = -1;
  for (const auto& e : sse_events(r.body)) {
    if (e.contains("usage") && !e["usage"].is_null()) completion = e["usage"]["completion_tokens"];
    for (const auto& ch : e["choices"]) {
      if (ch["logprobs"].is_null()) continue;
      for (const auto& x : ch["logprobs"]["content"]) {
        check_chat_entry(x, 5);
        ++entries;
      }
    }
  }
  EXPECT_GT(entries, 0);
  EXPECT_EQ(entries, completion);  // every token, EOS included, once
}

TEST_F(ServerTest, CompletionLogprobs) {
  start();
  Client c(port());
  for (bool stream : {false, true}) {
    c.send("POST", "/v1/completions", completion_body("hi", stream, R"("logprobs":2)"));
    Response r = c.read();
    ASSERT_EQ(r.status, 200) << r.body;
    json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
    std::string text;
    auto take = [&](const json& ch) {
      text += ch["text"].get<std::string>();
      if (ch["logprobs"].is_null()) return;
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        ASSERT_TRUE(ch["logprobs"][k].is_array()) << k;
      for (const auto& x : ch["logprobs"]["tokens"]) tokens.push_back(x);
      for (const auto& x : ch["logprobs"]["token_logprobs"]) lps.push_back(x);
      for (const auto& x : ch["logprobs"]["top_logprobs"]) tops.push_back(x);
      for (const auto& x : ch["logprobs"]["text_offset"]) offs.push_back(x);
    };
    if (stream) {
      for (const auto& e : sse_events(r.body))
        for (const auto& ch : e["choices"]) take(ch);
    } else {
      take(json::parse(r.body)["choices"][0]);
    }
    EXPECT_EQ(text, "Hello from the fake backend.");
    ASSERT_GT(tokens.size(), 1u);
    ASSERT_EQ(lps.size(), tokens.size());
    ASSERT_EQ(tops.size(), tokens.size());
    ASSERT_EQ(offs.size(), tokens.size());
    int64_t expect_off = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(offs[i], expect_off) << i;
      expect_off += utf8_length(tokens[i].get<std::string>());
      ASSERT_EQ(tops[i].size(), 2u) << tops[i].dump();
      double prev = 0;
      for (const auto& [tok, lp] : tops[i].items()) {
        EXPECT_LE(lp.get<double>(), prev);
        prev = lp.get<double>();
      }
      // Greedy: the generated token is the most likely.
      EXPECT_EQ(tops[i].begin().key(), tokens[i].get<std::string>());
      EXPECT_DOUBLE_EQ(tops[i].begin().value().get<double>(), lps[i].get<double>());
    }
  }
}

}  // namespace
}  // namespace m3::server
