#include "server/http/request_parsing.h"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/rfc7230.hpp>
#include <cctype>

#include "server/protocol/errors.h"

namespace m3::server::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

int read_error_status(const beast::error_code& ec) {
  if (ec.category() != bhttp::make_error_code(bhttp::error::end_of_stream).category()) {
    return 0;  // the socket's own errors and timeouts
  }
  switch (static_cast<bhttp::error>(ec.value())) {
    case bhttp::error::end_of_stream:   // closed between requests
    case bhttp::error::partial_message: // closed in the middle of one: nobody reads an answer
      return 0;
    case bhttp::error::header_limit:
      return 431;
    case bhttp::error::body_limit:
      return 413;
    default:
      return 400;
  }
}

std::optional<Rejection> check_request_header(const RequestParser& parser) {
  const auto& req = parser.get();
  if (req.version() != 10 && req.version() != 11) {
    return Rejection{400, "Only HTTP/1.0 and HTTP/1.1 are served here."};
  }
  if (req.version() == 11 && req.count(bhttp::field::host) == 0) {
    return Rejection{400, "An HTTP/1.1 request must carry a Host header."};  // RFC 9112 3.2
  }
  for (auto field : {bhttp::field::host, bhttp::field::authorization, bhttp::field::content_type,
                     bhttp::field::content_length}) {
    if (req.count(field) > 1) {
      return Rejection{400, "The request has more than one '" +
                                std::string(bhttp::to_string(field)) + "' header."};
    }
  }
  if (req.count(bhttp::field::transfer_encoding) > 0) {
    if (req.count(bhttp::field::content_length) > 0) {
      return Rejection{400, "The request has both Transfer-Encoding and Content-Length."};
    }
    if (!parser.chunked()) {
      return Rejection{400, "Transfer-Encoding must end with 'chunked' in a request."};
    }
    // Beast refuses a repeated Transfer-Encoding header, so there is one list to read.
    int codings = 0;
    for (const auto& coding : bhttp::token_list(req[bhttp::field::transfer_encoding])) {
      (void)coding;
      ++codings;
    }
    if (codings != 1) {
      return Rejection{501, "Transfer codings other than 'chunked' are not supported."};
    }
  }
  return std::nullopt;
}

Request to_request(bhttp::request<bhttp::string_body>&& msg) {
  Request req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& f : msg) {
    std::string name(f.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req.headers[name] = std::string(f.value());
  }
  req.body = std::move(msg.body());
  req.received = std::chrono::steady_clock::now();
  return req;
}

std::string rejection_response(const Rejection& rejection) {
  ApiError e;
  e.status = rejection.status;
  e.message = rejection.message;
  e.code = rejection.status == 431 ? "headers_too_large"
           : rejection.status == 413 ? "request_too_large"
           : rejection.status == 501 ? "not_implemented"
                                     : "bad_http_request";
  const std::string body = e.body();
  auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(rejection.status));
  return "HTTP/1.1 " + std::to_string(rejection.status) + " " +
         std::string(reason.data(), reason.size()) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace m3::server::http
