// fetch_remote_image against a loopback HTTP server started by the test: the happy path, DNS
// pinning (a made-up name answered only by the injected resolver), redirects re-checked at every
// hop (one into 169.254.169.254, chains of 3 and 4), the time limit against a server that never
// answers, the byte limit with and without Content-Length, type checks, HTTP errors, and no
// cookie sent back across a redirect. Loopback is reachable only through the test-only option.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "loopback_http_server.h"
#include "server/media/remote_fetch.h"

namespace m3::server {
namespace {

using testing_http::LoopbackServer;

const std::string kPng = std::string("\x89PNG\r\n\x1a\n", 8) + std::string(64, 'p');
const std::string kJpeg = std::string("\xff\xd8\xff\xe0", 4) + std::string(64, 'j');

MediaOptions test_options() {
  MediaOptions o;
  o.allowed_domains = {"127.0.0.1", "images.test", "169.254.169.254"};
  o.allow_loopback_for_tests = true;
  o.max_image_bytes = 1000;
  o.fetch_timeout = std::chrono::milliseconds(2000);
  return o;
}

// Answers only for images.test (no real DNS): fetching through it proves the pinning.
Resolver test_resolver() {
  return [](const std::string& host,
            std::chrono::milliseconds) -> Result<std::vector<std::string>> {
    if (host == "images.test") return std::vector<std::string>{"127.0.0.1"};
    return invalid_argument("cannot resolve '" + host + "'");
  };
}

ApiError error_of(const std::variant<FetchedImage, ApiError>& r) {
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << "expected a refusal";
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(RemoteFetch, FetchesAnImageThroughThePinnedAddress) {
  LoopbackServer s;
  s.route("/a.png", [] { return LoopbackServer::response(200, "image/png", kPng); });
  auto r = fetch_remote_image(s.base("images.test") + "/a.png", "img", test_options(),
                              test_resolver());
  ASSERT_TRUE(std::holds_alternative<FetchedImage>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<FetchedImage>(r).bytes, kPng);
  EXPECT_EQ(std::get<FetchedImage>(r).mime, "image/png");
  ASSERT_EQ(s.heads().size(), 1u);
  EXPECT_NE(s.heads()[0].find("Host: images.test:"), std::string::npos) << s.heads()[0];
}

TEST(RemoteFetch, LoopbackIsRefusedWithoutTheTestOption) {
  LoopbackServer s;
  s.route("/a.png", [] { return LoopbackServer::response(200, "image/png", kPng); });
  MediaOptions o = test_options();
  o.allow_loopback_for_tests = false;
  const ApiError e = error_of(fetch_remote_image(s.base("images.test") + "/a.png", "img", o,
                                                 test_resolver()));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "media_address_not_allowed");
  EXPECT_TRUE(s.heads().empty()) << "nothing may be sent to a refused address";
}

TEST(RemoteFetch, RedirectsAreCheckedAtEveryHop) {
  LoopbackServer s;
  s.route("/meta", [] { return LoopbackServer::redirect("http://169.254.169.254/latest/"); });
  const ApiError e = error_of(
      fetch_remote_image(s.base() + "/meta", "img", test_options(), test_resolver()));
  EXPECT_EQ(e.code, "media_address_not_allowed") << e.message;
  EXPECT_NE(e.message.find("redirect"), std::string::npos) << e.message;

  // A redirect to a host outside --allowed-media-domains.
  s.route("/elsewhere", [] { return LoopbackServer::redirect("http://evil.example/x.png"); });
  EXPECT_EQ(error_of(fetch_remote_image(s.base() + "/elsewhere", "img", test_options(),
                                        test_resolver()))
                .code,
            "media_domain_not_allowed");

  // Three redirects are followed (a relative Location too), a fourth is refused.
  const std::string b = s.base("images.test");
  s.route("/r1", [b] { return LoopbackServer::redirect(b + "/r2"); });
  s.route("/r2", [] { return LoopbackServer::redirect("/r3"); });
  s.route("/r3", [b] { return LoopbackServer::redirect(b + "/img"); });
  s.route("/img", [] { return LoopbackServer::response(200, "image/jpeg", kJpeg); });
  s.route("/r0", [b] { return LoopbackServer::redirect(b + "/r1"); });
  auto ok = fetch_remote_image(b + "/r1", "img", test_options(), test_resolver());
  ASSERT_TRUE(std::holds_alternative<FetchedImage>(ok)) << std::get<ApiError>(ok).message;
  EXPECT_EQ(std::get<FetchedImage>(ok).redirects, 3);
  EXPECT_EQ(std::get<FetchedImage>(ok).mime, "image/jpeg");
  const ApiError four = error_of(fetch_remote_image(b + "/r0", "img", test_options(),
                                                    test_resolver()));
  EXPECT_NE(four.message.find("more than 3"), std::string::npos) << four.message;
}

TEST(RemoteFetch, NoCookieOrCredentialCrossesARedirect) {
  LoopbackServer s;
  const std::string b = s.base("images.test");
  s.route("/c1", [b] { return LoopbackServer::redirect(b + "/c2", "Set-Cookie: sid=secret\r\n"); });
  s.route("/c2", [] { return LoopbackServer::response(200, "image/png", kPng); });
  auto r = fetch_remote_image(b + "/c1", "img", test_options(), test_resolver());
  ASSERT_TRUE(std::holds_alternative<FetchedImage>(r)) << std::get<ApiError>(r).message;
  for (const std::string& h : s.heads()) {
    EXPECT_EQ(h.find("Cookie"), std::string::npos) << h;
    EXPECT_EQ(h.find("Authorization"), std::string::npos) << h;
  }
  // Credentials in the URL are refused before anything is sent.
  EXPECT_FALSE(std::holds_alternative<FetchedImage>(fetch_remote_image(
      "http://user:pw@images.test:" + std::to_string(s.port()) + "/c2", "img", test_options(),
      test_resolver())));
}

TEST(RemoteFetch, ASlowServerHitsTheTimeLimit) {
  LoopbackServer s;
  s.route("/slow", [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return LoopbackServer::response(200, "image/png", kPng);
  });
  MediaOptions o = test_options();
  o.fetch_timeout = std::chrono::milliseconds(300);
  const auto t0 = std::chrono::steady_clock::now();
  const ApiError e = error_of(fetch_remote_image(s.base() + "/slow", "img", o, test_resolver()));
  const double s_elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(e.code, "media_fetch_timeout") << e.message;
  EXPECT_NE(e.message.find("--media-fetch-timeout"), std::string::npos);
  EXPECT_LT(s_elapsed, 1.2) << "the limit must cut the transfer, not wait for the server";
}

TEST(RemoteFetch, TheByteLimitHoldsWhateverContentLengthSays) {
  LoopbackServer s;
  const std::string big = kPng + std::string(10 * 1000, 'x');  // 10x --max-image-bytes
  s.route("/declared", [big] { return LoopbackServer::response(200, "image/png", big); });
  // No Content-Length: the body runs until the connection closes.
  s.route("/undeclared", [big] {
    return "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n" + big;
  });
  for (const char* path : {"/declared", "/undeclared"}) {
    const ApiError e = error_of(
        fetch_remote_image(s.base() + path, "img", test_options(), test_resolver()));
    EXPECT_EQ(e.code, "image_too_large") << path << ": " << e.message;
    EXPECT_NE(e.message.find("--max-image-bytes"), std::string::npos);
  }
}

TEST(RemoteFetch, TheBytesMustBeTheDeclaredImageType) {
  LoopbackServer s;
  s.route("/lying", [] { return LoopbackServer::response(200, "image/png", kJpeg); });
  s.route("/html", [] { return LoopbackServer::response(200, "text/html", "<html></html>"); });
  s.route("/html-jpeg", [] { return LoopbackServer::response(200, "text/html", kJpeg); });
  s.route("/octets", [] {
    return LoopbackServer::response(200, "application/octet-stream", kJpeg);
  });
  s.route("/empty", [] { return LoopbackServer::response(200, "image/png", ""); });
  s.route("/gone", [] { return LoopbackServer::response(404, "text/plain", "gone"); });
  for (const char* path : {"/lying", "/html", "/html-jpeg", "/empty", "/gone"}) {
    const ApiError e =
        error_of(fetch_remote_image(s.base() + path, "img", test_options(), test_resolver()));
    EXPECT_EQ(e.status, 400) << path;
    EXPECT_EQ(e.param, "img") << path;
  }
  EXPECT_NE(error_of(fetch_remote_image(s.base() + "/gone", "img", test_options(),
                                        test_resolver()))
                .message.find("404"),
            std::string::npos);
  auto ok = fetch_remote_image(s.base() + "/octets", "img", test_options(), test_resolver());
  ASSERT_TRUE(std::holds_alternative<FetchedImage>(ok)) << std::get<ApiError>(ok).message;
  EXPECT_EQ(std::get<FetchedImage>(ok).mime, "image/jpeg");
}

TEST(RemoteFetch, OtherSchemesAndClosedPortsAreClearErrors) {
  EXPECT_FALSE(std::holds_alternative<FetchedImage>(
      fetch_remote_image("file:///etc/passwd", "img", test_options(), test_resolver())));
  EXPECT_FALSE(std::holds_alternative<FetchedImage>(
      fetch_remote_image("ftp://images.test/a.png", "img", test_options(), test_resolver())));
  // A port nobody listens on: a fetch error, quickly.
  int closed_port = 0;
  {
    LoopbackServer s;
    closed_port = s.port();
  }
  const ApiError e = error_of(fetch_remote_image(
      "http://127.0.0.1:" + std::to_string(closed_port) + "/a.png", "img", test_options(),
      test_resolver()));
  EXPECT_EQ(e.code, "media_fetch_failed") << e.message;
}

}  // namespace
}  // namespace m3::server
