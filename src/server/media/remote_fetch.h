// Fetching a remote image (http or https) under the media policy, with libcurl.
//
// Each hop of the fetch is vetted by check_image_url (scheme, --allowed-media-domains, every
// resolved address public) and the connection is then pinned to the vetted address
// (CURLOPT_RESOLVE), so a name cannot resolve to a public address for the check and to an
// internal one for the connection (DNS rebinding). Redirects are not followed by libcurl: each
// Location is checked as a new URL, at most `max_redirects` times. One deadline covers the whole
// fetch (all hops, DNS included); the body is counted while it streams and the transfer stops at
// the byte limit, whatever Content-Length said. No cookies, credentials, proxies from the
// environment or content encodings (no gzip bombs) are used. The bytes must be an image whose
// type (from its magic bytes) agrees with a declared image Content-Type.
//
// The call blocks for up to the deadline: run it off the server's I/O threads.
#pragma once

#include <chrono>
#include <string>
#include <variant>

#include "server/media/media_policy.h"
#include "server/protocol/errors.h"

namespace m3::server {

struct FetchedImage {
  std::string bytes;
  std::string mime;       // from the magic bytes: "image/png", ...
  std::string final_url;  // after redirects
  int redirects = 0;
};

// Fetches `url` (already known to be http or https) as the request field `param`. Errors are 400
// objects whose message names the limit or policy that refused the image.
std::variant<FetchedImage, ApiError> fetch_remote_image(const std::string& url,
                                                        const std::string& param,
                                                        const MediaOptions& options,
                                                        const Resolver& resolve = system_resolve);

}  // namespace m3::server
