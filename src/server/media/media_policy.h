// Image inputs at the protocol layer (before any vision tower exists):
//  * data: URIs are decoded (strict base64) and validated: declared type image/png, image/jpeg,
//    image/webp or image/gif, magic bytes matching the declared type, and a size limit;
//  * remote URLs are refused unless the host is on --allowed-media-domains; an allowed host must
//    also resolve only to public addresses (no private, loopback, link-local, CGNAT, multicast or
//    reserved ranges, including IPv4 embedded in IPv6), so an allowlisted name cannot be pointed
//    at the internal network (SSRF). URLs with credentials or non-http(s) schemes are refused.
// Remote images are fetched by remote_fetch.h, which runs this check again at every hop; their
// bytes, like a data: URI's, go on to image_decode.h.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/status.h"
#include "server/protocol/errors.h"

namespace m3::server {

struct MediaOptions {
  std::vector<std::string> allowed_domains;  // "example.com" (exact) or ".example.com" (subdomains)
  size_t max_image_bytes = 20u << 20;
  int64_t max_image_pixels = 89'478'485;  // width * height, from the header (image_decode.h)
  std::chrono::milliseconds resolve_timeout{3000};
  // A remote fetch, all redirects and DNS included (--media-fetch-timeout).
  std::chrono::milliseconds fetch_timeout{5000};
  int max_redirects = 3;
  // Loopback addresses pass the address check: only for tests that serve images from a local
  // HTTP server (--allow-loopback-media-for-tests, refused outside a test environment).
  bool allow_loopback_for_tests = false;
};

// Host name -> its addresses (as text). Injected so tests need no DNS.
using Resolver = std::function<Result<std::vector<std::string>>(const std::string& host,
                                                                std::chrono::milliseconds timeout)>;
Result<std::vector<std::string>> system_resolve(const std::string& host,
                                                std::chrono::milliseconds timeout);

struct CheckedImage {
  std::string mime;  // "image/png", ...
  size_t bytes = 0;  // decoded size (data URIs)
  bool remote = false;
  std::string data;  // the image file's bytes (data URIs); empty for remote URLs
};

// std::nullopt-free result: the checked image, or the 400 to send (param names the field).
std::variant<CheckedImage, ApiError> check_image_url(const std::string& url,
                                                     const std::string& param,
                                                     const MediaOptions& options,
                                                     const Resolver& resolve = system_resolve);

// Helpers, exposed for tests.
std::optional<std::string> base64_decode(std::string_view in);
// "image/png" etc. from magic bytes, or empty.
std::string sniff_image_type(std::string_view bytes);
// True for a globally routable unicast address (v4 or v6, textual form).
bool is_public_address(const std::string& address);
// True for 127.0.0.0/8 and ::1.
bool is_loopback_address(const std::string& address);

}  // namespace m3::server
