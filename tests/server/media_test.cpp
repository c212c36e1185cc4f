#include <gtest/gtest.h>

#include "server/media/media_policy.h"

namespace m3::server {
namespace {

std::string b64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += t[v >> 18], out += t[(v >> 12) & 63], out += t[(v >> 6) & 63], out += t[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += t[v >> 18], out += t[(v >> 12) & 63], out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += t[v >> 18], out += t[(v >> 12) & 63], out += t[(v >> 6) & 63], out += '=';
  }
  return out;
}

const std::string kPng = std::string("\x89PNG\r\n\x1a\n", 8) + std::string(32, '\0');
const std::string kJpeg = std::string("\xff\xd8\xff\xe0", 4) + std::string(32, 'j');

Resolver fixed(std::vector<std::string> addrs) {
  return [addrs](const std::string&,
                 std::chrono::milliseconds) -> Result<std::vector<std::string>> { return addrs; };
}

ApiError err(const std::variant<CheckedImage, ApiError>& r) {
  EXPECT_TRUE(std::holds_alternative<ApiError>(r));
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(Media, Base64) {
  EXPECT_EQ(*base64_decode("aGVsbG8="), "hello");
  EXPECT_EQ(*base64_decode("aGVsbG8"), "hello");
  EXPECT_EQ(*base64_decode(b64(kPng)), kPng);
  EXPECT_FALSE(base64_decode("a*b="));
  EXPECT_FALSE(base64_decode("a"));
  EXPECT_FALSE(base64_decode("aGVsbG8==="));
}

TEST(Media, Sniff) {
  EXPECT_EQ(sniff_image_type(kPng), "image/png");
  EXPECT_EQ(sniff_image_type(kJpeg), "image/jpeg");
  EXPECT_EQ(sniff_image_type("GIF89a......"), "image/gif");
  EXPECT_EQ(sniff_image_type(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16)), "image/webp");
  EXPECT_EQ(sniff_image_type("hello world!"), "");
}

TEST(Media, DataUris) {
  MediaOptions o;
  auto ok = check_image_url("data:image/png;base64," + b64(kPng), "p", o);
  ASSERT_TRUE(std::holds_alternative<CheckedImage>(ok));
  EXPECT_EQ(std::get<CheckedImage>(ok).mime, "image/png");
  EXPECT_EQ(std::get<CheckedImage>(ok).bytes, kPng.size());
  EXPECT_NE(
      err(check_image_url("data:image/png;base64," + b64(kJpeg), "p", o)).message.find("declares"),
      std::string::npos);
  EXPECT_EQ(err(check_image_url("data:image/png;base64,@@@@", "p", o)).param, "p");
  EXPECT_NE(err(check_image_url("data:text/plain;base64," + b64("hi"), "p", o))
                .message.find("text/plain"),
            std::string::npos);
  EXPECT_NE(err(check_image_url("data:image/png," + kPng, "p", o)).message.find("base64"),
            std::string::npos);
  EXPECT_NE(err(check_image_url("data:image/png;base64," + b64("not an image at all"), "p", o))
                .message.find("not a PNG"),
            std::string::npos);
  o.max_image_bytes = 16;
  EXPECT_NE(
      err(check_image_url("data:image/png;base64," + b64(kPng), "p", o)).message.find("larger"),
      std::string::npos);
}

TEST(Media, RemoteUrlsNeedTheAllowlist) {
  MediaOptions o;
  auto e = err(check_image_url("https://example.com/a.png", "p", o, fixed({"93.184.216.34"})));
  EXPECT_EQ(e.code, "media_domain_not_allowed");
  o.allowed_domains = {"example.com", ".cdn.net"};
  auto ok = check_image_url("https://example.com/a.png", "p", o, fixed({"93.184.216.34"}));
  ASSERT_TRUE(std::holds_alternative<CheckedImage>(ok));
  EXPECT_TRUE(std::get<CheckedImage>(ok).remote);
  EXPECT_TRUE(std::holds_alternative<CheckedImage>(
      check_image_url("https://img.cdn.net/x", "p", o, fixed({"8.8.8.8"}))));
  EXPECT_EQ(err(check_image_url("https://cdn.net/x", "p", o, fixed({"8.8.8.8"}))).code,
            "media_domain_not_allowed");
  EXPECT_EQ(err(check_image_url("https://evil-example.com/x", "p", o, fixed({"8.8.8.8"}))).code,
            "media_domain_not_allowed");
  // An allowlisted name pointing inside is refused (SSRF).
  for (const char* inside : {"127.0.0.1", "10.1.2.3", "192.168.0.5", "169.254.169.254", "::1",
                             "fe80::1", "fd00::1", "::ffff:127.0.0.1", "100.64.0.1"}) {
    EXPECT_EQ(
        err(check_image_url("https://example.com/a.png", "p", o, fixed({"8.8.8.8", inside}))).code,
        "media_address_not_allowed")
        << inside;
  }
  EXPECT_EQ(
      err(check_image_url("https://user:pw@example.com/a.png", "p", o, fixed({"8.8.8.8"}))).code,
      "invalid_image");
  EXPECT_EQ(err(check_image_url("ftp://example.com/a.png", "p", o, fixed({"8.8.8.8"}))).code,
            "invalid_image");
  auto fail = [](const std::string&,
                 std::chrono::milliseconds) -> Result<std::vector<std::string>> {
    return invalid_argument("cannot resolve");
  };
  EXPECT_EQ(err(check_image_url("https://example.com/a.png", "p", o, fail)).code, "invalid_image");
}

TEST(Media, PublicAddresses) {
  EXPECT_TRUE(is_public_address("8.8.8.8"));
  EXPECT_TRUE(is_public_address("2606:4700:4700::1111"));
  for (const char* a :
       {"0.0.0.0", "127.0.0.1", "10.0.0.1", "172.16.5.4", "172.31.255.255", "192.168.1.1",
        "169.254.1.1", "100.100.100.100", "224.0.0.1", "255.255.255.255", "::", "::1", "fe80::1",
        "fc00::1", "ff02::1", "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:a00:1::1", "not an ip"}) {
    EXPECT_FALSE(is_public_address(a)) << a;
  }
  EXPECT_TRUE(is_public_address("172.32.0.1"));
  EXPECT_TRUE(is_public_address("::ffff:8.8.8.8"));
}

}  // namespace
}  // namespace m3::server
