#include "server/media/remote_fetch.h"

#include <curl/curl.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cctype>
#include <memory>
#include <mutex>

namespace m3::server {

namespace {

using Clock = std::chrono::steady_clock;

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct UrlDeleter {
  void operator()(CURLU* u) const { curl_url_cleanup(u); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Host (without brackets) and port of an http(s) URL, through libcurl's own parser so that the
// pinned name is exactly the one libcurl will look up.
struct HostPort {
  std::string host;
  long port = 0;
};
std::optional<HostPort> host_port(const std::string& url) {
  std::unique_ptr<CURLU, UrlDeleter> u(curl_url());
  if (!u || curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) return std::nullopt;
  char* host = nullptr;
  char* port = nullptr;
  if (curl_url_get(u.get(), CURLUPART_HOST, &host, 0) != CURLUE_OK) return std::nullopt;
  const CURLUcode pc = curl_url_get(u.get(), CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
  HostPort out;
  out.host = host;
  curl_free(host);
  if (pc != CURLUE_OK) return std::nullopt;
  out.port = std::strtol(port, nullptr, 10);
  curl_free(port);
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']')
    out.host = out.host.substr(1, out.host.size() - 2);
  return out;
}

struct Transfer {
  std::string body;
  size_t limit = 0;
  bool over_limit = false;
};

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (t->body.size() + bytes > t->limit) {
    t->over_limit = true;
    return 0;  // CURLE_WRITE_ERROR: stop the transfer now
  }
  t->body.append(data, bytes);
  return bytes;
}

std::string media_type(const char* content_type) {
  if (!content_type) return "";
  std::string t = lower(content_type);
  t = t.substr(0, t.find(';'));
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t == "image/jpg") t = "image/jpeg";
  return t;
}

}  // namespace

std::variant<FetchedImage, ApiError> fetch_remote_image(const std::string& url0,
                                                        const std::string& param,
                                                        const MediaOptions& options,
                                                        const Resolver& resolve) {
  init_curl_once();
  const auto deadline = Clock::now() + options.fetch_timeout;
  auto fail = [&](const std::string& msg, const std::string& code = "invalid_image") {
    return bad_request(msg, param, code);
  };
  auto timed_out = [&] {
    return fail("Fetching the image took longer than --media-fetch-timeout (" +
                    std::to_string(options.fetch_timeout.count()) + " ms).",
                "media_fetch_timeout");
  };
  std::string url = url0;
  for (int hop = 0;; ++hop) {
    // The policy check, remembering the addresses it vetted (the resolver is called at most
    // once per hop; a literal address is its own only address).
    std::vector<std::string> vetted;
    const auto remaining = [&] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    };
    MediaOptions hop_options = options;
    hop_options.resolve_timeout = std::min(options.resolve_timeout, remaining());
    if (hop_options.resolve_timeout.count() <= 0) return timed_out();
    Resolver capture = [&](const std::string& host, std::chrono::milliseconds t)
        -> Result<std::vector<std::string>> {
      auto r = resolve(host, t);
      if (r.is_ok()) vetted = r.value();
      return r;
    };
    auto checked = check_image_url(url, param, hop_options, capture);
    if (auto* e = std::get_if<ApiError>(&checked)) {
      if (hop > 0) e->message = "A redirect of the image URL was refused: " + e->message;
      return *e;
    }
    const std::optional<HostPort> hp = host_port(url);
    if (!hp) return fail("Malformed image URL.");
    if (vetted.empty()) vetted.push_back(hp->host);  // a literal address

    // Pin the connection to the first vetted address: libcurl does no lookup of its own.
    boost::system::error_code ec;
    const auto addr = boost::asio::ip::make_address(vetted.front(), ec);
    if (ec) return fail("The image host resolved to an unusable address.");
    const std::string pinned =
        addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string();
    std::unique_ptr<curl_slist, SlistDeleter> resolve_list(curl_slist_append(
        nullptr, (hp->host + ":" + std::to_string(hp->port) + ":" + pinned).c_str()));

    std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
    if (!curl || !resolve_list) return fail("Cannot fetch the image: out of memory.");
    CURL* c = curl.get();
    Transfer t;
    t.limit = options.max_image_bytes;
    const long ms = static_cast<long>(remaining().count());
    if (ms <= 0) return timed_out();
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_RESOLVE, resolve_list.get());
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);  // every hop is re-checked here
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROXY, "");  // no proxy from the environment
    curl_easy_setopt(c, CURLOPT_NETRC, static_cast<long>(CURL_NETRC_IGNORED));
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE,
                     static_cast<curl_off_t>(options.max_image_bytes));
    curl_easy_setopt(c, CURLOPT_USERAGENT, "m3serve");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    const CURLcode rc = curl_easy_perform(c);
    if (t.over_limit || rc == CURLE_FILESIZE_EXCEEDED) {
      return fail("The image is larger than --max-image-bytes (" +
                      std::to_string(options.max_image_bytes) + " bytes).",
                  "image_too_large");
    }
    if (rc == CURLE_OPERATION_TIMEDOUT) return timed_out();
    if (rc != CURLE_OK) {
      return fail(std::string("Cannot fetch the image: ") + curl_easy_strerror(rc) + ".",
                  "media_fetch_failed");
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
      char* location = nullptr;
      curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &location);
      if (!location) return fail("The image URL redirects without a Location.", "media_fetch_failed");
      if (hop + 1 > options.max_redirects) {
        return fail("The image URL redirects more than " + std::to_string(options.max_redirects) +
                        " times.",
                    "media_fetch_failed");
      }
      url = location;
      continue;
    }
    if (status != 200) {
      return fail("Fetching the image failed with HTTP status " + std::to_string(status) + ".",
                  "media_fetch_failed");
    }
    char* content_type = nullptr;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &content_type);
    const std::string declared = media_type(content_type);
    const std::string sniffed = sniff_image_type(t.body);
    if (sniffed.empty()) {
      return fail("The fetched body is not a PNG, JPEG, WebP or GIF image" +
                  (declared.empty() ? std::string(".") : " (Content-Type " + declared + ")."));
    }
    if (declared.rfind("image/", 0) == 0 && declared != sniffed) {
      return fail("The fetched image is " + sniffed + " but its Content-Type says " + declared +
                  ".");
    }
    if (!declared.empty() && declared.rfind("image/", 0) != 0 &&
        declared != "application/octet-stream" && declared != "binary/octet-stream") {
      return fail("The image URL returned Content-Type " + declared + ", not an image.");
    }
    FetchedImage out;
    out.bytes = std::move(t.body);
    out.mime = sniffed;
    out.final_url = url;
    out.redirects = hop;
    return out;
  }
}

}  // namespace m3::server
