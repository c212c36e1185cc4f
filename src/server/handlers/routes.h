// The HTTP routes: auth, dispatch, and every endpoint.
//   GET  /health            200 when loaded and not draining, else 503 (no auth)
//   GET  /health_generate   200 after a 1-token generation succeeds
//   GET  /v1/models, /v1/models/{id}
//   POST /v1/chat/completions, /v1/completions (streaming or not)
//   POST /tokenize, /detokenize
//   GET  /metrics           Prometheus text
// With --api-key every route but /health needs "Authorization: Bearer <key>".
#pragma once

#include <memory>

#include "server/handlers/context.h"
#include "server/http/http_server.h"

namespace m3::server {

void handle_request(ServerContext& ctx, http::Request&& request,
                    std::shared_ptr<http::Responder> responder);

// Whether an Authorization header carries the key: the scheme "Bearer" in any case, one or more
// spaces, then the key, compared in constant time.
bool authorized(const std::string& api_key, const std::string& authorization_header);

}  // namespace m3::server
