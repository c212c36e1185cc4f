#include "server/media/media_policy.h"

#include <netdb.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cctype>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

namespace m3::server {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool v4_is_public(uint32_t a) {
  auto in = [a](uint32_t net, int bits) {
    uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
    return (a & mask) == (net & mask);
  };
  auto ip = [](int x, int y, int z, int w) {
    return (uint32_t(x) << 24) | (uint32_t(y) << 16) | (uint32_t(z) << 8) | uint32_t(w);
  };
  return !(in(ip(0, 0, 0, 0), 8) || in(ip(10, 0, 0, 0), 8) || in(ip(100, 64, 0, 0), 10) ||
           in(ip(127, 0, 0, 0), 8) || in(ip(169, 254, 0, 0), 16) || in(ip(172, 16, 0, 0), 12) ||
           in(ip(192, 0, 0, 0), 24) || in(ip(192, 0, 2, 0), 24) || in(ip(192, 88, 99, 0), 24) ||
           in(ip(192, 168, 0, 0), 16) || in(ip(198, 18, 0, 0), 15) || in(ip(198, 51, 100, 0), 24) ||
           in(ip(203, 0, 113, 0), 24) || in(ip(224, 0, 0, 0), 4) || in(ip(240, 0, 0, 0), 4));
}

}  // namespace

bool is_public_address(const std::string& text) {
  boost::system::error_code ec;
  auto addr = boost::asio::ip::make_address(text, ec);
  if (ec) return false;
  if (addr.is_v4()) return v4_is_public(addr.to_v4().to_uint());
  auto v6 = addr.to_v6();
  auto b = v6.to_bytes();
  if (v6.is_unspecified() || v6.is_loopback() || v6.is_multicast()) return false;
  if ((b[0] & 0xfe) == 0xfc) return false;                  // fc00::/7 unique local
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return false;  // fe80::/10 link-local
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return false;  // fec0::/10 site-local
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8) return false;  // 2001:db8::/32
  auto embedded_v4 = [&](int at) {
    return (uint32_t(b[at]) << 24) | (uint32_t(b[at + 1]) << 16) | (uint32_t(b[at + 2]) << 8) |
           uint32_t(b[at + 3]);
  };
  if (v6.is_v4_mapped()) return v4_is_public(embedded_v4(12));
  bool zeros96 = std::all_of(b.begin(), b.begin() + 12, [](unsigned char c) { return c == 0; });
  if (zeros96) return false;  // deprecated v4-compatible form (::a.b.c.d)
  static const unsigned char kNat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
  if (std::memcmp(b.data(), kNat64, 12) == 0) return v4_is_public(embedded_v4(12));
  if (b[0] == 0x20 && b[1] == 0x02) {  // 2002::/16 6to4 embeds the v4 address
    return v4_is_public(embedded_v4(2));
  }
  return true;
}

bool is_loopback_address(const std::string& text) {
  boost::system::error_code ec;
  const boost::asio::ip::address a = boost::asio::ip::make_address(text, ec);
  return !ec && a.is_loopback();
}

std::optional<std::string> base64_decode(std::string_view in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  size_t n = in.size();
  while (n > 0 && in[n - 1] == '=') --n;
  if (in.size() - n > 2) return std::nullopt;
  if (in.size() % 4 != 0 && in.size() != n) return std::nullopt;  // padded but misaligned
  if (n % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(n * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    int v = val(in[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::string sniff_image_type(std::string_view b) {
  if (b.size() >= 8 && b.substr(0, 8) == std::string_view("\x89PNG\r\n\x1a\n", 8))
    return "image/png";
  if (b.size() >= 3 && b.substr(0, 3) == "\xff\xd8\xff") return "image/jpeg";
  if (b.size() >= 6 && (b.substr(0, 6) == "GIF87a" || b.substr(0, 6) == "GIF89a"))
    return "image/gif";
  if (b.size() >= 12 && b.substr(0, 4) == "RIFF" && b.substr(8, 4) == "WEBP") return "image/webp";
  return "";
}

Result<std::vector<std::string>> system_resolve(const std::string& host,
                                                std::chrono::milliseconds timeout) {
  // getaddrinfo has no timeout: run it on a detached thread and stop waiting after `timeout`.
  auto promise = std::make_shared<std::promise<Result<std::vector<std::string>>>>();
  auto future = promise->get_future();
  std::thread([host, promise] {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc != 0) {
      promise->set_value(invalid_argument("cannot resolve '" + host + "': " + gai_strerror(rc)));
      return;
    }
    std::vector<std::string> out;
    for (addrinfo* p = res; p; p = p->ai_next) {
      char buf[NI_MAXHOST];
      if (getnameinfo(p->ai_addr, p->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0)
        out.emplace_back(buf);
    }
    freeaddrinfo(res);
    promise->set_value(std::move(out));
  }).detach();
  if (future.wait_for(timeout) != std::future_status::ready) {
    return invalid_argument("resolving '" + host + "' timed out");
  }
  return future.get();
}

std::variant<CheckedImage, ApiError> check_image_url(const std::string& url,
                                                     const std::string& param,
                                                     const MediaOptions& options,
                                                     const Resolver& resolve) {
  auto fail = [&](const std::string& msg) { return bad_request(msg, param, "invalid_image"); };
  std::string head = lower(url.substr(0, std::min<size_t>(url.size(), 16)));
  if (head.rfind("data:", 0) == 0) {
    size_t comma = url.find(',');
    if (comma == std::string::npos) return fail("Malformed data: URI (no ',').");
    std::string meta = lower(url.substr(5, comma - 5));
    bool b64 = meta.size() >= 7 && meta.substr(meta.size() - 7) == ";base64";
    if (!b64) return fail("Image data: URIs must be base64-encoded (';base64,').");
    std::string mime = meta.substr(0, meta.find(';'));
    if (mime == "image/jpg") mime = "image/jpeg";
    if (mime != "image/png" && mime != "image/jpeg" && mime != "image/webp" &&
        mime != "image/gif") {
      return fail("Unsupported image type '" + mime +
                  "'; allowed: image/png, image/jpeg, image/webp, image/gif.");
    }
    std::string_view data = std::string_view(url).substr(comma + 1);
    if (data.size() / 4 * 3 > options.max_image_bytes + 3) {
      return fail("The image is larger than the limit of " +
                  std::to_string(options.max_image_bytes) + " bytes.");
    }
    auto bytes = base64_decode(data);
    if (!bytes) return fail("The image data: URI is not valid base64.");
    if (bytes->size() > options.max_image_bytes) {
      return fail("The image is larger than the limit of " +
                  std::to_string(options.max_image_bytes) + " bytes.");
    }
    std::string sniffed = sniff_image_type(*bytes);
    if (sniffed.empty()) return fail("The image data is not a PNG, JPEG, WebP or GIF image.");
    if (sniffed != mime) {
      return fail("The image data is " + sniffed + " but the data: URI declares " + mime + ".");
    }
    const size_t size = bytes->size();
    return CheckedImage{mime, size, false, std::move(*bytes)};
  }

  // Remote URL: scheme://[userinfo@]host[:port]/...
  size_t sep = url.find("://");
  if (sep == std::string::npos) return fail("Image URLs must be data: URIs or http(s) URLs.");
  std::string scheme = lower(url.substr(0, sep));
  if (scheme != "http" && scheme != "https") {
    return fail("Image URL scheme '" + scheme + "' is not allowed; use https or a data: URI.");
  }
  size_t start = sep + 3;
  size_t end = url.find_first_of("/?#", start);
  std::string authority =
      url.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (authority.find('@') != std::string::npos)
    return fail("Image URLs must not contain credentials.");
  std::string host;
  if (!authority.empty() && authority[0] == '[') {
    size_t close = authority.find(']');
    if (close == std::string::npos) return fail("Malformed IPv6 host in the image URL.");
    host = authority.substr(1, close - 1);
  } else {
    host = authority.substr(0, authority.find(':'));
  }
  host = lower(host);
  while (!host.empty() && host.back() == '.') host.pop_back();
  if (host.empty()) return fail("The image URL has no host.");
  bool allowed = false;
  for (const auto& d0 : options.allowed_domains) {
    std::string d = lower(d0);
    if (d.rfind("*.", 0) == 0) d = d.substr(1);
    if (!d.empty() && d[0] == '.') {
      allowed |= host.size() > d.size() && host.compare(host.size() - d.size(), d.size(), d) == 0;
    } else {
      allowed |= host == d;
    }
  }
  if (!allowed) {
    return bad_request(
        "Remote image URLs are refused unless their host is in "
        "--allowed-media-domains ('" +
            host +
            "' is not); send the image as a "
            "data: URI instead.",
        param, "media_domain_not_allowed");
  }
  boost::system::error_code ec;
  boost::asio::ip::make_address(host, ec);
  std::vector<std::string> addrs;
  if (!ec) {
    addrs.push_back(host);
  } else {
    auto r = resolve(host, options.resolve_timeout);
    if (!r.is_ok()) return fail("Cannot fetch the image: " + r.status().message() + ".");
    addrs = std::move(r).value();
    if (addrs.empty()) return fail("Cannot fetch the image: '" + host + "' has no addresses.");
  }
  for (const auto& a : addrs) {
    if (!is_public_address(a) && !(options.allow_loopback_for_tests && is_loopback_address(a))) {
      return bad_request(
          "The image host '" + host + "' resolves to a non-public address (" + a + "); refused.",
          param, "media_address_not_allowed");
    }
  }
  return CheckedImage{"", 0, true, {}};
}

}  // namespace m3::server
