#include <gtest/gtest.h>

#include "sample/sampling_params.h"
#include "server/protocol/messages.h"
#include "server/protocol/requests.h"

namespace m3::server {
namespace {

using json = nlohmann::ordered_json;

ApiError chat_error(const std::string& body) {
  auto j = parse_json_body(body);
  if (auto* e = std::get_if<ApiError>(&j)) return *e;
  auto r = parse_chat_request(std::get<json>(j));
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  return {};
}

ChatRequest chat_ok(const std::string& body) {
  auto r = parse_chat_request(json::parse(body));
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::get<ChatRequest>(r);
}

const char* kMsg = R"("messages":[{"role":"user","content":"hi"}])";

TEST(Protocol, MalformedJsonIs400) {
  auto e = chat_error("{\"messages\": [");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_NE(e.message.find("Malformed JSON"), std::string::npos);
  EXPECT_EQ(chat_error("[1,2]").status, 400);
  EXPECT_EQ(chat_error("").status, 400);
}

// Ill-formed UTF-8 in the body (a lone 0xFF, a lone continuation byte, an overlong form, a UTF-16
// surrogate, a sequence cut by the closing quote) is malformed JSON: 400, and the error body,
// whose message quotes the bytes the parser read last, is valid JSON (they become U+FFFD) instead
// of an exception that turned the reply into a 500.
TEST(Protocol, IllFormedUtf8Is400WithAValidErrorBody) {
  for (const std::string bad : {"\xff\xfe", "\x80", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82"}) {
    const std::string body =
        std::string(R"({"messages":[{"role":"user","content":"a)") + bad + R"("}]})";
    const ApiError e = chat_error(body);
    EXPECT_EQ(e.status, 400) << e.message;
    EXPECT_EQ(e.code, "invalid_json") << e.message;
    std::string out;
    ASSERT_NO_THROW(out = e.body()) << e.message;
    const json j = json::parse(out, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << out;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
  // Well-formed multi-byte text parses.
  const ChatRequest ok =
      chat_ok("{\"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9 \xc3\xa9 \xe4\xb8\xad "
              "\xf0\x9f\x98\x80\"}]}");
  EXPECT_EQ(ok.messages.size(), 1u);
}

// A submission the engine refuses (validate_sampling_params) names the field in `param`: its
// messages start with the field's name. Other refusals keep param empty; non-400 statuses map
// as from_status.
TEST(Protocol, EngineParameterErrorsNameTheField) {
  const auto param_of = [](auto set) {
    SamplingParams p;
    set(p);
    const Status st = validate_sampling_params(p, 100);
    EXPECT_FALSE(st.is_ok());
    const ApiError e = submit_error(st);
    EXPECT_EQ(e.status, 400) << st.message();
    return e.param;
  };
  EXPECT_EQ(param_of([](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }), "logit_bias");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.logit_bias = {{3, 101.0f}}; }), "logit_bias");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.max_tokens = 2, p.min_tokens = 5; }),
            "min_tokens");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.stop_token_ids = {-1}; }), "stop_token_ids");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.stop = {""}; }), "stop");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.temperature = -1.0f; }), "temperature");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.top_p = 0.0f; }), "top_p");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.top_k = -2; }), "top_k");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.n = 0; }), "n");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.top_logprobs = 21; }), "top_logprobs");
  EXPECT_EQ(param_of([](SamplingParams& p) { p.max_tokens = 0; }), "max_tokens");
  EXPECT_EQ(submit_error(invalid_argument("the prompt has no tokens")).param, "");
  EXPECT_EQ(submit_error(invalid_argument("nonsense")).param, "");
  const ApiError busy = submit_error(Status(StatusCode::kResourceExhausted, "top_k queue full"));
  EXPECT_EQ(busy.status, 429);
  EXPECT_EQ(busy.param, "");
}

TEST(Protocol, ErrorObjectShape) {
  ApiError e = bad_request("bad", "temperature");
  json j = e.to_json();
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(Protocol, InvalidParametersNameTheField) {
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"temperature":"hot"})").param, "temperature");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"temperature":-1})").param, "temperature");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"top_p":1.5})").param, "top_p");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"n":17})").param, "n");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"n":0})").param, "n");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"stop":[1]})").param, "stop");
  EXPECT_EQ(
      chat_error(std::string("{") + kMsg + R"(,"stream_options":{"include_usage":true}})").param,
      "stream_options");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"logprobs":1})").param, "logprobs");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"top_logprobs":3})").param, "top_logprobs");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"logprobs":true,"top_logprobs":21})").param,
            "top_logprobs");
  EXPECT_EQ(
      chat_error(std::string("{") + kMsg + R"(,"response_format":{"type":"json_object"}})").param,
      "response_format.type");
  EXPECT_EQ(chat_error(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(chat_error(R"({"messages":[{"role":"wizard","content":"x"}]})").param,
            "messages[0].role");
  EXPECT_EQ(
      chat_error(R"({"messages":[{"role":"user","content":[{"type":"input_audio"}]}]})").param,
      "messages[0].content[0].type");
}

// Every sampling control of the API reaches the backend's SamplingOptions unchanged, and a bad
// value is a 400 naming it. max_completion_tokens wins over the deprecated max_tokens.
TEST(Protocol, SamplingFieldsReachTheRequest) {
  auto r = chat_ok(std::string("{") + kMsg +
                   R"(,"temperature":0.5,"top_p":0.9,"top_k":7,"min_p":0.05,)"
                   R"("presence_penalty":0.25,"frequency_penalty":-0.5,"repetition_penalty":1.1,)"
                   R"("seed":42,"min_tokens":3,"ignore_eos":true,"stop":["END","\n\n"],)"
                   R"("stop_token_ids":[5,9],"max_tokens":100,"max_completion_tokens":20})");
  const SamplingOptions& s = r.gen.sampling;
  EXPECT_EQ(s.temperature, 0.5);
  EXPECT_EQ(s.top_p, 0.9);
  EXPECT_EQ(s.top_k, 7);
  EXPECT_EQ(s.min_p, 0.05);
  EXPECT_EQ(s.presence_penalty, 0.25);
  EXPECT_EQ(s.frequency_penalty, -0.5);
  EXPECT_EQ(s.repetition_penalty, 1.1);
  EXPECT_EQ(s.seed, 42u);
  EXPECT_EQ(s.min_tokens, 3);
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"END", "\n\n"}));
  EXPECT_EQ(s.stop_token_ids, (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(r.gen.max_tokens, 20);
  EXPECT_EQ(chat_ok(std::string("{") + kMsg + R"(,"max_completion_tokens":33})").gen.max_tokens,
            33);
  // Unset fields stay unset, so the backend applies generation_config.json's defaults.
  auto d = chat_ok(std::string("{") + kMsg + "}");
  EXPECT_FALSE(d.gen.sampling.temperature || d.gen.sampling.top_p || d.gen.sampling.top_k ||
               d.gen.sampling.min_p || d.gen.sampling.repetition_penalty || d.gen.max_tokens);
  EXPECT_FALSE(d.gen.sampling.ignore_eos);

  for (const auto& [field, bad] :
       std::vector<std::pair<std::string, std::string>>{{"min_p", "1.5"},
                                                        {"top_k", "-2"},
                                                        {"presence_penalty", "3"},
                                                        {"frequency_penalty", "-2.5"},
                                                        {"repetition_penalty", "0"},
                                                        {"ignore_eos", "\"yes\""},
                                                        {"stop_token_ids", "[\"a\"]"},
                                                        {"max_completion_tokens", "0"},
                                                        {"seed", "\"x\""}}) {
    EXPECT_EQ(chat_error(std::string("{") + kMsg + ",\"" + field + "\":" + bad + "}").param, field)
        << field << "=" << bad;
  }
}

TEST(Protocol, ThinkingField) {
  auto e = chat_error(std::string("{") + kMsg + R"(,"thinking":{"type":"on"}})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "thinking.type");
  for (const char* v : {"enabled", "disabled", "adaptive"}) {
    EXPECT_NE(e.message.find(v), std::string::npos) << "the message names allowed value " << v;
  }
  EXPECT_EQ(chat_ok(std::string("{") + kMsg + "}").thinking_mode, "adaptive");
  auto r = chat_ok(std::string("{") + kMsg + R"(,"thinking":{"type":"enabled"}})");
  EXPECT_EQ(r.thinking_mode, "enabled");
  EXPECT_EQ(r.template_kwargs["thinking_mode"], "enabled");
}

TEST(Protocol, ReasoningEffort) {
  auto r = chat_ok(std::string("{") + kMsg + R"(,"reasoning_effort":"xhigh"})");
  EXPECT_EQ(r.template_kwargs["reasoning_effort"], "xhigh");
  EXPECT_EQ(r.thinking_mode, "adaptive");
  for (const char* off : {"none", "minimal"}) {
    auto d = chat_ok(std::string("{") + kMsg + R"(,"reasoning_effort":")" + off + "\"}");
    EXPECT_EQ(d.thinking_mode, "disabled");
  }
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"reasoning_effort":"huge"})").param,
            "reasoning_effort");
  EXPECT_EQ(chat_error(std::string("{") + kMsg +
                       R"(,"reasoning_effort":"none","thinking":{"type":"enabled"}})")
                .status,
            400);
}

TEST(Protocol, ChatTemplateKwargs) {
  auto r = chat_ok(std::string("{") + kMsg +
                   R"(,"chat_template_kwargs":{"thinking_mode":"disabled","x":1}})");
  EXPECT_EQ(r.thinking_mode, "disabled");
  EXPECT_EQ(r.template_kwargs["x"], 1);
  auto q =
      chat_ok(std::string("{") + kMsg + R"(,"chat_template_kwargs":{"enable_thinking":true}})");
  EXPECT_EQ(q.thinking_mode, "enabled");
  // The top-level field wins over the kwargs.
  auto t = chat_ok(
      std::string("{") + kMsg +
      R"(,"chat_template_kwargs":{"thinking_mode":"disabled"},"thinking":{"type":"enabled"}})");
  EXPECT_EQ(t.thinking_mode, "enabled");
}

TEST(Protocol, ToolChoice) {
  std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
  EXPECT_EQ(
      chat_ok(std::string("{") + kMsg + "," + tools + R"(,"tool_choice":"required"})").tool_choice,
      ToolChoice::kRequired);
  auto named = chat_ok(std::string("{") + kMsg + "," + tools +
                       R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})");
  EXPECT_EQ(named.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_choice_name, "f");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + "," + tools +
                       R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})")
                .param,
            "tool_choice.function.name");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"tool_choice":"required"})").param,
            "tool_choice");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"tool_choice":"sometimes"})").param,
            "tool_choice");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"tools":[{"type":"function","function":{}}]})")
                .param,
            "tools[0].function.name");
}

TEST(Protocol, MessagesRoundTripIntoTemplateForm) {
  json msgs = json::parse(R"([
    {"role":"system","content":[{"type":"text","text":"be "},{"type":"text","text":"brief"}]},
    {"role":"user","content":"weather?"},
    {"role":"assistant","content":null,"reasoning_content":"need the tool",
     "tool_calls":[{"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"city\":\"Paris\",\"n\":2}"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"sunny"},
    {"role":"assistant","content":"It is sunny.","reasoning":"from the tool"}
  ])");
  std::vector<ImageRef> images;
  auto r = convert_messages(msgs, images);
  ASSERT_TRUE(std::holds_alternative<json>(r));
  json t = std::get<json>(r);
  EXPECT_EQ(t[0]["content"], "be brief");
  EXPECT_EQ(t[2]["content"], "");
  EXPECT_EQ(t[2]["reasoning_content"], "need the tool");
  EXPECT_EQ(t[2]["tool_calls"][0]["function"]["arguments"],
            json::parse(R"({"city":"Paris","n":2})"));
  EXPECT_EQ(t[2]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(t[3]["tool_call_id"], "call_1");
  EXPECT_EQ(t[3]["content"], "sunny");
  EXPECT_EQ(t[4]["reasoning_content"], "from the tool");
  EXPECT_TRUE(images.empty());

  // OpenAI's "refusal" parts: an assistant's content, written as text; nobody else's.
  auto refusal = convert_messages(json::parse(R"([{"role":"user","content":"x"},
      {"role":"assistant","content":[{"type":"refusal","refusal":"I cannot."}]}])"), images);
  ASSERT_TRUE(std::holds_alternative<json>(refusal));
  EXPECT_EQ(std::get<json>(refusal)[1]["content"], "I cannot.");
  auto user_refusal = convert_messages(
      json::parse(R"([{"role":"user","content":[{"type":"refusal","refusal":"x"}]}])"), images);
  ASSERT_TRUE(std::holds_alternative<ApiError>(user_refusal));
  EXPECT_EQ(std::get<ApiError>(user_refusal).param, "messages[0].content[0].type");
  auto bad_refusal = convert_messages(json::parse(R"([{"role":"user","content":"x"},
      {"role":"assistant","content":[{"type":"refusal","refusal":5}]}])"), images);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad_refusal));
  EXPECT_EQ(std::get<ApiError>(bad_refusal).param, "messages[1].content[0].refusal");
}

TEST(Protocol, BadToolCallArgumentsNamed) {
  json msgs = json::parse(R"([{"role":"assistant","content":"","tool_calls":[
    {"id":"x","type":"function","function":{"name":"f","arguments":"{not json"}}]}])");
  std::vector<ImageRef> images;
  auto r = convert_messages(msgs, images);
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).param, "messages[0].tool_calls[0].function.arguments");
}

TEST(Protocol, ImagesAreCollected) {
  json msgs = json::parse(R"([{"role":"user","content":[{"type":"text","text":"look"},
    {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}])");
  std::vector<ImageRef> images;
  auto r = convert_messages(msgs, images);
  ASSERT_TRUE(std::holds_alternative<json>(r));
  ASSERT_EQ(images.size(), 1u);
  EXPECT_EQ(images[0].param, "messages[0].content[1].image_url.url");
  EXPECT_EQ(std::get<json>(r)[0]["content"][1]["type"], "image");
}

TEST(Protocol, CompletionPrompt) {
  auto r = parse_completion_request(json::parse(R"({"prompt":"abc","max_tokens":3,"stop":"x"})"));
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  auto& c = std::get<CompletionRequest>(r);
  ASSERT_EQ(c.prompts.size(), 1u);
  EXPECT_EQ(*c.prompts[0].text, "abc");
  EXPECT_EQ(*c.gen.max_tokens, 3);
  EXPECT_EQ(c.gen.sampling.stop, std::vector<std::string>{"x"});
  auto ids = parse_completion_request(json::parse(R"({"prompt":[1,2,3]})"));
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ids));
  ASSERT_EQ(std::get<CompletionRequest>(ids).prompts.size(), 1u);
  EXPECT_EQ(std::get<CompletionRequest>(ids).prompts[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*std::get<CompletionRequest>(ids).gen.max_tokens, 16);  // OpenAI's default
  // Batches: a list of strings, a list of token-id lists.
  auto batch = parse_completion_request(json::parse(R"({"prompt":["a","b"]})"));
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(batch));
  ASSERT_EQ(std::get<CompletionRequest>(batch).prompts.size(), 2u);
  EXPECT_EQ(*std::get<CompletionRequest>(batch).prompts[1].text, "b");
  auto id_batch = parse_completion_request(json::parse(R"({"prompt":[[1],[2,3]]})"));
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(id_batch));
  ASSERT_EQ(std::get<CompletionRequest>(id_batch).prompts.size(), 2u);
  EXPECT_EQ(std::get<CompletionRequest>(id_batch).prompts[1].tokens, (std::vector<int32_t>{2, 3}));
  // Mixed batches, empty prompts and bad ids name the item.
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt":["a",[1]]})", "prompt[1]"},
           {R"({"prompt":[[1],"a"]})", "prompt[1]"},
           {R"({"prompt":["a",""]})", "prompt[1]"},
           {R"({"prompt":[[1],[]]})", "prompt[1]"},
           {R"({"prompt":[[1],[-1]]})", "prompt[1]"},
           {R"({"prompt":[1,"a"]})", "prompt"},
           {R"({"prompt":[]})", "prompt"},
           {R"({"prompt":""})", "prompt"},
           {R"({"prompt":{"a":1}})", "prompt"}}) {
    auto e = parse_completion_request(json::parse(body));
    ASSERT_TRUE(std::holds_alternative<ApiError>(e)) << body;
    EXPECT_EQ(std::get<ApiError>(e).param, param) << body;
  }
  json many = {{"prompt", json::array()}};
  for (int i = 0; i <= kMaxBatchedPrompts; ++i) many["prompt"].push_back("x");
  auto too_many = parse_completion_request(many);
  ASSERT_TRUE(std::holds_alternative<ApiError>(too_many));
  EXPECT_NE(std::get<ApiError>(too_many).message.find(std::to_string(kMaxBatchedPrompts)),
            std::string::npos);
}

TEST(Protocol, LogitBias) {
  ChatRequest c = chat_ok(std::string("{") + kMsg + R"(,"logit_bias":{"17":-100,"42":5.5}})");
  ASSERT_EQ(c.gen.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(c.gen.sampling.logit_bias[0], (std::pair<int32_t, float>{17, -100.0f}));
  EXPECT_EQ(c.gen.sampling.logit_bias[1], (std::pair<int32_t, float>{42, 5.5f}));
  for (const char* bad : {R"("logit_bias":[1])", R"("logit_bias":{"x":1})", R"("logit_bias":{"-1":1})",
                          R"("logit_bias":{"5":101})", R"("logit_bias":{"5":"a"})"}) {
    EXPECT_EQ(chat_error(std::string("{") + kMsg + "," + bad + "}").param, "logit_bias") << bad;
  }
}

TEST(Protocol, ChoicesAndLogprobs) {
  ChatRequest c = chat_ok(std::string("{") + kMsg + R"(,"n":16,"logprobs":true,"top_logprobs":20})");
  EXPECT_EQ(c.gen.n, 16);
  EXPECT_TRUE(c.gen.sampling.logprobs);
  EXPECT_EQ(c.gen.sampling.top_logprobs, 20);
  ChatRequest plain = chat_ok(std::string("{") + kMsg + "}");
  EXPECT_EQ(plain.gen.n, 1);
  EXPECT_FALSE(plain.gen.sampling.logprobs);
  // The limit is in the message.
  ApiError e = chat_error(std::string("{") + kMsg + R"(,"n":17})");
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("16"), std::string::npos) << e.message;

  auto ok = parse_completion_request(json::parse(R"({"prompt":"abc","logprobs":0,"n":3})"));
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ok));
  EXPECT_TRUE(std::get<CompletionRequest>(ok).gen.sampling.logprobs);
  EXPECT_EQ(std::get<CompletionRequest>(ok).gen.sampling.top_logprobs, 0);
  EXPECT_EQ(std::get<CompletionRequest>(ok).gen.n, 3);
  for (const char* body : {R"({"prompt":"abc","logprobs":6})", R"({"prompt":"abc","logprobs":true})",
                           R"({"prompt":"abc","logprobs":2,"echo":true})"}) {
    auto r = parse_completion_request(json::parse(body));
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).param, "logprobs") << body;
  }
}

}  // namespace
// Fields other servers accept and m3serve cannot honour: a 400 naming the field, not a silent
// ignore; the same fields at their defaults are accepted.
TEST(Protocol, UnsupportedFieldsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> asked = {
      {"guided_json", R"({"type":"object"})"}, {"guided_regex", R"("a+")"},
      {"guided_choice", R"(["a","b"])"},       {"guided_grammar", R"("root ::= x")"},
      {"structured_outputs", R"({"choice":["a"]})"}, {"structural_tag", R"({"a":1})"},
      {"json_schema", R"({"type":"object"})"}, {"regex", R"("a")"},
      {"ebnf", R"("x")"},                      {"prompt_logprobs", "0"},
      {"use_beam_search", "true"},             {"include_stop_str_in_output", "true"},
      {"return_tokens_as_token_ids", "true"},  {"priority", "1"},
      {"lora_path", R"("x")"},                 {"lora_request", R"({"lora_name":"x"})"},
      {"return_hidden_states", "true"},
      {"chat_template", R"("{{ x }}")"},       {"echo", "true"},
      {"functions", R"([{"name":"f"}])"},      {"function_call", R"("auto")"},
      {"audio", R"({"voice":"x"})"},           {"modalities", R"(["text","audio"])"}};
  for (const auto& [field, value] : asked) {
    ApiError e = chat_error(std::string("{") + kMsg + ",\"" + field + "\":" + value + "}");
    EXPECT_EQ(e.status, 400) << field;
    EXPECT_EQ(e.param, field);
    EXPECT_EQ(e.code, "unsupported_parameter") << field;
  }
  // At their defaults (or null) they ask for nothing.
  chat_ok(std::string("{") + kMsg +
          R"(,"use_beam_search":false,"priority":0,"guided_json":null,"echo":false,)"
          R"("include_stop_str_in_output":false,"modalities":["text"],"functions":[]})");
  // Chat-only fields do not apply to /v1/completions ('echo' is its own there).
  auto r = parse_completion_request(json::parse(R"({"prompt":"a","echo":true})"));
  EXPECT_TRUE(std::holds_alternative<CompletionRequest>(r));
  auto g = parse_completion_request(json::parse(R"({"prompt":"a","guided_regex":"a+"})"));
  ASSERT_TRUE(std::holds_alternative<ApiError>(g));
  EXPECT_EQ(std::get<ApiError>(g).param, "guided_regex");
}

TEST(Protocol, ContinueFinalMessageAndTruncation) {
  const std::string two =
      R"("messages":[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is"}])";
  ChatRequest c = chat_ok("{" + two + R"(,"continue_final_message":true})");
  EXPECT_TRUE(c.continue_final_message);
  EXPECT_FALSE(c.add_generation_prompt);
  EXPECT_TRUE(chat_ok("{" + two + R"(,"continue_final_message":true,"add_generation_prompt":null})")
                  .continue_final_message);
  EXPECT_EQ(chat_error("{" + two + R"(,"continue_final_message":true,"add_generation_prompt":true})")
                .param,
            "continue_final_message");
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"continue_final_message":true})").param,
            "continue_final_message");
  EXPECT_FALSE(chat_ok(std::string("{") + kMsg + R"(,"add_generation_prompt":false})")
                   .add_generation_prompt);
  EXPECT_EQ(*chat_ok(std::string("{") + kMsg + R"(,"truncate_prompt_tokens":-1})")
                 .gen.truncate_prompt_tokens,
            -1);
  for (const char* bad : {"0", "-2", "1.5", R"("5")"}) {
    EXPECT_EQ(chat_error(std::string("{") + kMsg + ",\"truncate_prompt_tokens\":" + bad + "}").param,
              "truncate_prompt_tokens")
        << bad;
  }
  EXPECT_EQ(chat_error(std::string("{") + kMsg + R"(,"skip_special_tokens":1})").param,
            "skip_special_tokens");
}

}  // namespace m3::server
