// The pool's admin routes, as SGLang's router has them: POST /add_worker?url=URL,
// POST /remove_worker?url=URL, GET /list_workers. The API key (when set) guards them like every
// other route; router.cpp checks it before they run.
#include <nlohmann/json.hpp>

#include "router/router.h"
#include "server/protocol/errors.h"

namespace m3::router {

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The value of `name` in the target's query string, percent-decoded ('+' is a space); empty
// when absent.
std::string query_param(const std::string& target, const std::string& name) {
  const size_t q = target.find('?');
  if (q == std::string::npos) return {};
  size_t pos = q + 1;
  while (pos <= target.size()) {
    size_t end = target.find('&', pos);
    if (end == std::string::npos) end = target.size();
    const std::string pair = target.substr(pos, end - pos);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name && eq != std::string::npos) {
      std::string out;
      const std::string raw = pair.substr(eq + 1);
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '%' && i + 2 < raw.size() + 0 && hex_value(raw[i + 1]) >= 0 &&
            hex_value(raw[i + 2]) >= 0) {
          out.push_back(static_cast<char>(hex_value(raw[i + 1]) * 16 + hex_value(raw[i + 2])));
          i += 2;
        } else {
          out.push_back(raw[i] == '+' ? ' ' : raw[i]);
        }
      }
      return out;
    }
    pos = end + 1;
  }
  return {};
}

void send_error(server::http::Responder& responder, const server::ApiError& e) {
  responder.send(e.status, "application/json", e.body());
}

}  // namespace

void Router::handle_admin(const Request& req, Responder& responder) {
  if (req.path == "/list_workers") {
    if (req.method != "GET") {
      return send_error(responder, server::method_not_allowed(req.method, req.path));
    }
    nlohmann::ordered_json urls = nlohmann::ordered_json::array();
    nlohmann::ordered_json workers = nlohmann::ordered_json::array();
    for (const auto& w : workers_.all()) {
      urls.push_back(w->url);
      workers.push_back({{"url", w->url},
                         {"healthy", w->healthy.load()},
                         {"in_flight", w->in_flight.load()},
                         {"requests_total", w->requests_total.load()}});
    }
    nlohmann::ordered_json j = {{"urls", urls}, {"workers", workers}};
    return responder.send(200, "application/json", j.dump());
  }
  if (req.method != "POST") {
    return send_error(responder, server::method_not_allowed(req.method, req.path));
  }
  const std::string url = query_param(req.target, "url");
  if (url.empty()) {
    return send_error(responder, server::bad_request("Missing the query parameter 'url' (" +
                                                         req.path + "?url=http://host:port).",
                                                     "url"));
  }
  if (req.path == "/add_worker") {
    const Status s = add_worker(url);
    if (!s) return send_error(responder, server::bad_request(s.message(), "url"));
    return responder.send(200, "application/json",
                          nlohmann::json({{"added", url}}).dump());
  }
  if (!remove_worker(url)) {
    return send_error(responder,
                      server::not_found("No worker " + url + " in the pool.", "worker_not_found"));
  }
  responder.send(200, "application/json", nlohmann::json({{"removed", url}}).dump());
}

}  // namespace m3::router
