// Image input end to end through the real stack (checkpoint -> engine -> HTTP server):
//  * m3-tiny's language model without vision weights (whether or not the bundled checkpoint has a
//    tower, tools/train_tiny can train one): an image request is a 400 vision_not_available;
//  * m3-tiny's language model plus a tiny random vision tower (config.json's vision_config and a
//    vision shard, in a temporary directory): a chat request with an image generates tokens, the
//    prompt holds the image's placeholder tokens, the prefix cache reuses KV for the same image
//    and never for another image, and with m3-tiny's DSpark draft the greedy answer is the same.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../model/tiny_vision.h"
#include "../server/image_fixtures.h"
#include "../server/test_client.h"
#include "app/engine_stack.h"
#include "loader/safetensors_writer.h"
#include "server/server.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using server::testing_http::Client;
using server::testing_http::Response;

const fs::path kModel = fs::path(M3_REPO_ROOT) / "models" / "m3-tiny";

// A running server over an engine stack.
struct Served {
  app::EngineStack stack;
  std::unique_ptr<server::Server> srv;
  explicit Served(app::EngineStack s) : stack(std::move(s)) {
    server::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.served_model_names = {"m3-tiny"};
    srv = std::make_unique<server::Server>(o, stack.backend.get(), stack.codec.get(),
                                           stack.renderer.get());
    EXPECT_TRUE(srv->start().is_ok());
  }
  ~Served() { srv->stop(); }
};

app::EngineStack make_stack(const fs::path& dir, bool speculative = false) {
  app::EngineStackOptions o;
  o.num_threads = 2;
  o.kv_cache_bytes = int64_t{32} << 20;
  // m3-tiny's DSpark draft (the language model is m3-tiny's, whatever folder it is served from).
  o.speculative = speculative;
  if (speculative) o.draft_model_path = (kModel / "dspark").string();
  auto s = app::make_engine_stack(dir.string(), o);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return std::move(s).value();
}

json image_chat(const std::string& png, const std::string& text) {
  return {{"model", "m3-tiny"},
          {"messages",
           {{{"role", "user"},
             {"content",
              {{{"type", "image_url"},
                {"image_url", {{"url", "data:image/png;base64," + server::testing::base64(png)}}}},
               {{"type", "text"}, {"text", text}}}}}}},
          {"max_tokens", 6},
          {"temperature", 0},
          {"logprobs", true}};
}

Response post(uint16_t port, const json& body) {
  Client c(port);
  c.send("POST", "/v1/chat/completions", body.dump());
  return c.read();
}

// A directory with m3-tiny's files linked, its config.json copied and an index that lists only the
// language model's tensors: the bundled model's own tower (if any) and preprocessor_config.json
// are left out. Returns the config and the index for the caller to extend.
void link_language_model(const fs::path& dir, json* config, json* index) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(kModel)) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || name == "model.safetensors.index.json" ||
        name == "preprocessor_config.json") {
      continue;
    }
    fs::create_symlink(fs::absolute(entry.path()), dir / name);
  }
  *config = json::parse(std::ifstream(kModel / "config.json"));
  json full = json::parse(std::ifstream(kModel / "model.safetensors.index.json"));
  *index = full;
  (*index)["weight_map"] = json::object();
  for (const auto& [name, shard] : full["weight_map"].items()) {
    if (name.rfind("language_model.", 0) == 0) (*index)["weight_map"][name] = shard;
  }
  std::ofstream(dir / "config.json") << config->dump(2);
  std::ofstream(dir / "model.safetensors.index.json") << index->dump(2);
}

TEST(VisionServing, ModelWithoutATowerRefusesImages) {
  const fs::path dir = fs::temp_directory_path() / ("m3-tiny-no-tower-" + std::to_string(::getpid()));
  json config, index;
  link_language_model(dir, &config, &index);
  Served s(make_stack(dir));
  EXPECT_FALSE(s.stack.backend->vision().has_value());
  bool reported = false;
  for (const std::string& line : s.stack.report) reported |= line.rfind("vision: ", 0) == 0;
  EXPECT_TRUE(reported);
  const std::string png = server::testing::encode_png(56, 56, 3, server::testing::pattern_rgb(56, 56));
  Response r = post(s.srv->port(), image_chat(png, "what is this?"));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "vision_not_available");
  fs::remove_all(dir);
}

// m3-tiny's files (shards linked, not copied) plus a tiny vision tower.
class TinyVisionModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("m3-tiny-vision-" + std::to_string(::getpid())));
    json config, index;
    link_language_model(*dir_, &config, &index);
    const int64_t text_hidden = config["text_config"]["hidden_size"].get<int64_t>();
    VisionConfig vc = testing::tiny_vision_config(text_hidden);
    vc.patch_size = 14;  // the real processor's geometry: 28-pixel merge windows
    config["vision_config"] = {{"hidden_size", vc.hidden_size},
                               {"num_attention_heads", vc.num_attention_heads},
                               {"num_hidden_layers", vc.num_hidden_layers},
                               {"intermediate_size", vc.intermediate_size},
                               {"patch_size", vc.patch_size},
                               {"temporal_patch_size", vc.temporal_patch_size},
                               {"spatial_merge_size", vc.spatial_merge_size},
                               {"hidden_act", "gelu"}};
    config["projector_hidden_size"] = vc.projector_hidden_size;
    std::ofstream(*dir_ / "config.json") << config.dump(2);
    testing::MemoryWeightSource vision;
    testing::add_random_vision_weights(vision, vc, 17);
    SafetensorsWriter w;
    for (const auto& [name, t] : vision.tensors) w.add_f32(name, t.shape, t.data);
    ASSERT_TRUE(w.write((*dir_ / "vision.safetensors").string()).is_ok());
    for (const auto& [name, t] : vision.tensors) index["weight_map"][name] = "vision.safetensors";
    std::ofstream(*dir_ / "model.safetensors.index.json") << index.dump(2);
    served_ = new Served(make_stack(*dir_));
  }
  static void TearDownTestSuite() {
    delete served_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path* dir_;
  static Served* served_;
};
fs::path* TinyVisionModel::dir_ = nullptr;
Served* TinyVisionModel::served_ = nullptr;

TEST_F(TinyVisionModel, ImageRequestGeneratesTokens) {
  ASSERT_TRUE(served_->stack.backend->vision().has_value());
  const uint16_t port = served_->srv->port();
  const std::string png = server::testing::encode_png(112, 84, 3, server::testing::pattern_rgb(112, 84));
  const std::string text = "Describe the picture.";
  Response with = post(port, image_chat(png, text));
  ASSERT_EQ(with.status, 200) << with.body;
  json u = json::parse(with.body)["usage"];
  EXPECT_GT(u["completion_tokens"].get<int>(), 0);
  // The same request without the image: the prompt differs by the expanded placeholder, i.e.
  // start + (84/28)(112/28) = 12 image tokens + end, where the template wrote one placeholder.
  json text_only = image_chat(png, text);
  text_only["messages"][0]["content"].erase(0);
  Response without = post(port, text_only);
  ASSERT_EQ(without.status, 200) << without.body;
  const int delta = u["prompt_tokens"].get<int>() -
                    json::parse(without.body)["usage"]["prompt_tokens"].get<int>();
  EXPECT_EQ(delta, 12 + 2);
}

// With the DSpark draft the image request is served too (the draft's context is the target's
// hidden states, which carry the image), and greedy output is the plain server's.
TEST_F(TinyVisionModel, ImageRequestWithTheDraftEqualsWithout) {
  Served spec(make_stack(*dir_, true));
  ASSERT_TRUE(spec.stack.backend->vision().has_value());
  const std::string png = server::testing::encode_png(112, 84, 3, server::testing::pattern_rgb(112, 84));
  json body = image_chat(png, "Describe the picture.");
  body["max_tokens"] = 40;
  body["temperature"] = 0;
  const Response plain = post(served_->srv->port(), body);
  const Response drafted = post(spec.srv->port(), body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  ASSERT_EQ(drafted.status, 200) << drafted.body;
  const json p = json::parse(plain.body), d = json::parse(drafted.body);
  EXPECT_EQ(d["choices"][0]["message"], p["choices"][0]["message"]);
  EXPECT_EQ(d["usage"]["completion_tokens"], p["usage"]["completion_tokens"]);
  ASSERT_TRUE(d["usage"].contains("m3serve_spec")) << d["usage"].dump();
  EXPECT_GT(d["usage"]["m3serve_spec"]["spec_verify_ct"].get<int>(), 0);
}

TEST_F(TinyVisionModel, PrefixCacheKeysOnTheImageContent) {
  const uint16_t port = served_->srv->port();
  // 224 x 224 -> 64 image tokens early in the prompt, then a long text, so several 32-token KV
  // pages follow the image.
  const std::string a = server::testing::encode_png(224, 224, 3, server::testing::pattern_rgb(224, 224, 1));
  const std::string b = server::testing::encode_png(224, 224, 3, server::testing::pattern_rgb(224, 224, 2));
  std::string text;
  for (int i = 0; i < 12; ++i) text += "Count the red squares in row " + std::to_string(i) + ". ";
  auto cached = [&](const std::string& png, json* out) {
    Response r = post(port, image_chat(png, text));
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body);
    if (out) *out = j;
    return j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  json first, again, other;
  cached(a, &first);
  const int prompt = first["usage"]["prompt_tokens"].get<int>();
  const int same = cached(a, &again);
  // The same image: everything but the last partial page (at least the last token) is reused.
  EXPECT_GE(same, (prompt - 1) / 32 * 32 - 32) << "prompt " << prompt;
  EXPECT_GT(same, 64);
  // Reused KV gives the same greedy output as computing it.
  EXPECT_EQ(again["choices"][0]["message"], first["choices"][0]["message"]);
  // Another image with the same tokens: only pages wholly before the image may be reused, so at
  // least the pages holding the image's 66 tokens (start, 64, end) less one partial page are not.
  const int diff = cached(b, &other);
  EXPECT_LE(diff, same - (66 - 32)) << "same image " << same << ", other image " << diff;
  // The image reaches the model: another image moves the first token's log-probability (the
  // placeholder tokens alone are identical in both prompts); the same image reproduces it.
  auto first_logprob = [](const json& j) {
    return j["choices"][0]["logprobs"]["content"][0]["logprob"].get<double>();
  };
  EXPECT_EQ(first_logprob(again), first_logprob(first));
  EXPECT_NE(first_logprob(other), first_logprob(first));
  // And image a is still cached as before.
  EXPECT_EQ(cached(a, nullptr), same);
}

}  // namespace
}  // namespace m3
