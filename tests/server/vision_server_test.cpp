// Image input through the HTTP server (fake backend, real sockets): images are decoded,
// pre-processed and placed at expanded placeholders; every bad image is a 400 and the server keeps
// serving.
#include "image_fixtures.h"
#include "server/handlers/image_inputs.h"
#include "test_client.h"

namespace m3::server {
namespace {

using namespace testing_http;

json image_part(const std::string& bytes, const std::string& mime = "image/png") {
  return {{"type", "image_url"},
          {"image_url", {{"url", "data:" + mime + ";base64," + testing::base64(bytes)}}}};
}

json chat_with(std::vector<json> parts) {
  return {{"messages", {{{"role", "user"}, {"content", parts}}}}, {"max_tokens", 4}};
}

class VisionServerTest : public ServerTest {
 protected:
  void start_vision(ServerOptions o = {}) {
    FakeBackendOptions fo;
    fo.vision = VisionPreprocessConfig{};
    start(o, fo);
  }
  Response post(Client& c, const json& body) {
    c.send("POST", "/v1/chat/completions", body.dump());
    return c.read();
  }
  int32_t id(std::string_view token) { return *codec_.token_id(token); }
};

TEST_F(VisionServerTest, ImagesReachTheBackendAtTheirPlaceholders) {
  start_vision();
  Client c(port());
  // 56 x 56 -> 4 x 4 patches -> 4 tokens; 84 x 56 (w x h) -> 4 x 6 patches -> 6 tokens.
  Response r = post(c, chat_with({{{"type", "text"}, {"text", "compare"}},
                                  image_part(testing::encode_png(56, 56, 3, testing::pattern_rgb(56, 56))),
                                  image_part(testing::encode_jpeg(84, 56, testing::pattern_rgb(84, 56)),
                                             "image/jpeg")}));
  ASSERT_EQ(r.status, 200) << r.body;
  BackendRequest b = backend_->last_request();
  ASSERT_EQ(b.images.size(), 2u);
  const int32_t want_tokens[2] = {4, 6};
  const int32_t want_grid[2][2] = {{4, 4}, {4, 6}};
  for (size_t i = 0; i < 2; ++i) {
    const BackendImage& img = *b.images[i];
    EXPECT_EQ(img.num_tokens, want_tokens[i]);
    EXPECT_EQ(img.grid_t, 1);
    EXPECT_EQ(img.grid_h, want_grid[i][0]);
    EXPECT_EQ(img.grid_w, want_grid[i][1]);
    EXPECT_EQ(img.pixel_values.size(), size_t(img.grid_h) * img.grid_w * 1176);
    ASSERT_GT(img.token_offset, 0);
    ASSERT_LT(size_t(img.token_offset + img.num_tokens), b.prompt_tokens.size());
    EXPECT_EQ(b.prompt_tokens[size_t(img.token_offset - 1)], id(kImageStartToken));
    for (int32_t t = 0; t < img.num_tokens; ++t) {
      EXPECT_EQ(b.prompt_tokens[size_t(img.token_offset + t)], id(kImageToken));
    }
    EXPECT_EQ(b.prompt_tokens[size_t(img.token_offset + img.num_tokens)], id(kImageEndToken));
  }
  EXPECT_LT(b.images[0]->token_offset, b.images[1]->token_offset);
  EXPECT_NE(b.images[0]->content_hash, b.images[1]->content_hash);
  int64_t image_tokens = 0;
  for (int32_t t : b.prompt_tokens) image_tokens += t == id(kImageToken);
  EXPECT_EQ(image_tokens, 10);
}

TEST_F(VisionServerTest, MmProcessorKwargsSetThePixelBounds) {
  start_vision();
  Client c(port());
  json body = chat_with({image_part(testing::encode_png(224, 224, 3, testing::pattern_rgb(224, 224)))});
  ASSERT_EQ(post(c, body).status, 200);
  EXPECT_EQ(backend_->last_request().images.at(0)->num_tokens, 64);  // 224^2 / 28^2
  body["mm_processor_kwargs"] = {{"max_pixels", 112 * 112}};
  ASSERT_EQ(post(c, body).status, 200);
  EXPECT_EQ(backend_->last_request().images.at(0)->num_tokens, 16);  // 112^2 / 28^2
  body["mm_processor_kwargs"] = {{"min_pixels", 448 * 448}, {"max_pixels", 448 * 448}};
  ASSERT_EQ(post(c, body).status, 200);
  EXPECT_EQ(backend_->last_request().images.at(0)->num_tokens, 256);
  for (json bad : {json{{"max_pixels", 0}}, json{{"min_pixels", "x"}}, json{{"size", 3}},
                   json{{"min_pixels", 10000}, {"max_pixels", 5000}}, json(7),
                   json{{"max_pixels", int64_t(1) << 40}},
                   // Above the default max_pixels: would upscale without bound.
                   json{{"min_pixels", int64_t(1) << 40}}}) {
    body["mm_processor_kwargs"] = bad;
    Response r = post(c, body);
    EXPECT_EQ(r.status, 400) << bad.dump() << " " << r.body;
    EXPECT_NE(json::parse(r.body)["error"]["param"].get<std::string>().find("mm_processor_kwargs"),
              std::string::npos) << r.body;
  }
}

TEST_F(VisionServerTest, BadImagesAre400sAndTheServerLivesOn) {
  start_vision();
  Client c(port());
  const std::string png = testing::encode_png(64, 64, 3, testing::pattern_rgb(64, 64));
  struct Bad {
    const char* what;
    json part;
    const char* code;
  };
  std::vector<uint8_t> line(100000 * 3, 7);
  const Bad cases[] = {
      {"truncated png", image_part(png.substr(0, png.size() / 2)), "invalid_image"},
      {"truncated jpeg", image_part(testing::encode_jpeg(64, 64, testing::pattern_rgb(64, 64)).substr(0, 300),
                                    "image/jpeg"), "invalid_image"},
      {"wrong magic", image_part(testing::encode_jpeg(8, 8, testing::pattern_rgb(8, 8))), "invalid_image"},
      {"png bomb", image_part(testing::png_declaring(200000, 200000)), "image_too_large"},
      {"100000 x 1", image_part(testing::encode_png(100000, 1, 3, line)), "invalid_image"},
      {"zero bytes", {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,"}}}},
       "invalid_image"},
      {"remote url", {{"type", "image_url"}, {"image_url", {{"url", "https://8.8.8.8/a.png"}}}},
       "media_domain_not_allowed"},
      {"video", {{"type", "video_url"}, {"video_url", {{"url", "data:video/mp4;base64,AAAA"}}}},
       "unsupported_content_type"},
  };
  for (const Bad& b : cases) {
    Response r = post(c, chat_with({{{"type", "text"}, {"text", "look"}}, b.part}));
    EXPECT_EQ(r.status, 400) << b.what << ": " << r.body;
    json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["code"], b.code) << b.what << ": " << r.body;
    EXPECT_FALSE(e["message"].get<std::string>().empty());
    // The next good request on the same connection is served.
    Response ok = post(c, chat_with({image_part(png)}));
    EXPECT_EQ(ok.status, 200) << b.what << ": " << ok.body;
  }
}

TEST_F(VisionServerTest, PlaceholderTypedInTheTextIsRefused) {
  start_vision();
  Client c(port());
  const std::string png = testing::encode_png(56, 56, 3, testing::pattern_rgb(56, 56));
  Response r = post(c, chat_with({{{"type", "text"}, {"text", "sneaky ]<]image[>[ here"}},
                                  image_part(png)}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "image_placeholder_mismatch") << r.body;
}

TEST_F(VisionServerTest, PixelLimitFlagApplies) {
  ServerOptions o;
  o.media.max_image_pixels = 1000;
  start_vision(o);
  Client c(port());
  Response r = post(c, chat_with({image_part(testing::encode_png(56, 56, 3, testing::pattern_rgb(56, 56)))}));
  EXPECT_EQ(r.status, 400);
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["code"], "image_too_large");
  EXPECT_NE(e["message"].get<std::string>().find("--max-image-pixels"), std::string::npos);
}

}  // namespace
}  // namespace m3::server
