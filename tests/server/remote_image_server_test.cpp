// Remote image URLs through the HTTP server (fake backend, real sockets): an image served by a
// loopback HTTP server started by the test is fetched, decoded and pre-processed exactly like the
// same bytes in a data: URI; a redirect into the cloud metadata address and a server slower than
// --media-fetch-timeout are 400s, and the server keeps serving. Loopback is reachable only
// through the test-only MediaOptions::allow_loopback_for_tests.
#include <chrono>
#include <thread>

#include "image_fixtures.h"
#include "loopback_http_server.h"
#include "test_client.h"

namespace m3::server {
namespace {

using namespace testing_http;

json url_part(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

json data_part(const std::string& png) {
  return url_part("data:image/png;base64," + testing::base64(png));
}

json chat_with(std::vector<json> parts) {
  return {{"messages", {{{"role", "user"}, {"content", parts}}}}, {"max_tokens", 4}};
}

class RemoteImageServerTest : public ServerTest {
 protected:
  void start_vision(ServerOptions o) {
    FakeBackendOptions fo;
    fo.vision = VisionPreprocessConfig{};
    start(o, fo);
  }
  static ServerOptions loopback_allowed() {
    ServerOptions o;
    o.media.allowed_domains = {"127.0.0.1"};
    o.media.allow_loopback_for_tests = true;
    return o;
  }
  Response post(Client& c, const json& body) {
    c.send("POST", "/v1/chat/completions", body.dump());
    return c.read();
  }

  const std::string png_ = testing::encode_png(56, 56, 3, testing::pattern_rgb(56, 56));
  const std::string jpeg_ = testing::encode_jpeg(84, 56, testing::pattern_rgb(84, 56, 7));
};

TEST_F(RemoteImageServerTest, AFetchedImageIsDecodedLikeTheSameBytesInADataUri) {
  LoopbackServer images;
  images.route("/cat.png", [this] { return LoopbackServer::response(200, "image/png", png_); });
  images.route("/dog.jpg", [this] { return LoopbackServer::response(200, "image/jpeg", jpeg_); });
  start_vision(loopback_allowed());
  Client c(port());

  // Two remote images (fetched one after the other) and a data: URI in one request.
  Response r = post(c, chat_with({{{"type", "text"}, {"text", "compare"}},
                                  url_part(images.base() + "/cat.png"),
                                  url_part(images.base() + "/dog.jpg"),
                                  data_part(png_)}));
  ASSERT_EQ(r.status, 200) << r.body;
  BackendRequest remote = backend_->last_request();
  ASSERT_EQ(remote.images.size(), 3u);
  EXPECT_EQ(images.heads().size(), 2u) << "one GET per remote image";
  // 56 x 56 -> 4 tokens; 84 x 56 (w x h) -> 6 tokens.
  EXPECT_EQ(remote.images[0]->num_tokens, 4);
  EXPECT_EQ(remote.images[1]->num_tokens, 6);
  EXPECT_EQ(remote.images[1]->grid_w, 6);
  // The same PNG fetched and inlined pre-processes to the same pixels.
  EXPECT_EQ(remote.images[0]->content_hash, remote.images[2]->content_hash);
  EXPECT_EQ(remote.images[0]->pixel_values, remote.images[2]->pixel_values);
  EXPECT_LT(remote.images[0]->token_offset, remote.images[1]->token_offset);
  EXPECT_LT(remote.images[1]->token_offset, remote.images[2]->token_offset);
}

TEST_F(RemoteImageServerTest, LoopbackIsRefusedWithoutTheTestOption) {
  LoopbackServer images;
  images.route("/cat.png", [this] { return LoopbackServer::response(200, "image/png", png_); });
  ServerOptions o = loopback_allowed();
  o.media.allow_loopback_for_tests = false;
  start_vision(o);
  Client c(port());
  Response r = post(c, chat_with({url_part(images.base() + "/cat.png")}));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "media_address_not_allowed") << r.body;
  EXPECT_TRUE(images.heads().empty()) << "nothing may be sent to a refused address";
}

TEST_F(RemoteImageServerTest, ARedirectToTheMetadataAddressIsA400AndTheServerLivesOn) {
  LoopbackServer images;
  images.route("/meta",
               [] { return LoopbackServer::redirect("http://169.254.169.254/latest/meta-data/"); });
  images.route("/cat.png", [this] { return LoopbackServer::response(200, "image/png", png_); });
  // 169.254.169.254 in the allowlist too: the address check, not the domain list, refuses it.
  ServerOptions o = loopback_allowed();
  o.media.allowed_domains.push_back("169.254.169.254");
  start_vision(o);
  Client c(port());
  Response r = post(c, chat_with({url_part(images.base() + "/meta")}));
  EXPECT_EQ(r.status, 400) << r.body;
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["code"], "media_address_not_allowed") << r.body;
  EXPECT_EQ(e["param"], "messages[0].content[0].image_url.url") << r.body;
  EXPECT_NE(e["message"].get<std::string>().find("redirect"), std::string::npos) << r.body;
  EXPECT_EQ(backend_->last_request().images.size(), 0u) << "nothing reached the backend";

  // The same connection goes on serving, remote images included.
  Response ok = post(c, chat_with({url_part(images.base() + "/cat.png")}));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(backend_->last_request().images.size(), 1u);
}

TEST_F(RemoteImageServerTest, AServerSlowerThanTheFetchTimeoutIsA400) {
  LoopbackServer images;
  images.route("/slow.png", [this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return LoopbackServer::response(200, "image/png", png_);
  });
  ServerOptions o = loopback_allowed();
  o.media.fetch_timeout = std::chrono::milliseconds(300);
  start_vision(o);
  Client c(port());
  const auto t0 = std::chrono::steady_clock::now();
  Response r = post(c, chat_with({url_part(images.base() + "/slow.png")}));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 400) << r.body;
  json e = json::parse(r.body)["error"];
  EXPECT_EQ(e["code"], "media_fetch_timeout") << r.body;
  EXPECT_NE(e["message"].get<std::string>().find("--media-fetch-timeout"), std::string::npos);
  EXPECT_LT(elapsed, 1.2) << "the limit must cut the fetch, not wait for the image server";

  // The loopback server is still asleep in that route, so the next request uses a data: URI.
  Response ok = post(c, chat_with({data_part(png_)}));
  EXPECT_EQ(ok.status, 200) << ok.body;
}

}  // namespace
}  // namespace m3::server
