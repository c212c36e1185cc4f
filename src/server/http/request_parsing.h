// What the HTTP layer accepts of a request, apart from the socket: the checks on a parsed header
// that Beast leaves to the application, the status answered for each parse error, and the
// conversion into a Request. Shared by the connection (http_server.cpp) and the front-door fuzz
// target, so both judge the same bytes the same way.
#pragma once

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <optional>
#include <string>

#include "server/http/http_server.h"

namespace m3::server::http {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;

// A request refused before it reaches a handler. The connection is closed after the answer:
// where a request's framing is in doubt, nothing after it on the wire can be trusted.
struct Rejection {
  int status = 400;
  std::string message;
};

// The status for a failed read: 400 for a malformed request (bad request line, version, header
// field, Content-Length, Transfer-Encoding, chunk), 431 for a header over the limit, 413 for a
// body over the limit; 0 where there is nobody to answer (the client closed, a timeout, a socket
// error): then the connection is closed without a word.
int read_error_status(const boost::beast::error_code& ec);

// Checks a header Beast parsed without error (RFC 9112 where Beast is lenient or silent):
// - HTTP/1.0 and HTTP/1.1 only (HTTP/2's preface parses as version 2.0);
// - Transfer-Encoding must end in chunked (else the body length is unknowable: 400) and carry no
//   other coding (501), and may not come with Content-Length (a smuggling vector: 400);
// - Host, Authorization, Content-Type and Content-Length may appear once each, and an HTTP/1.1
//   request must carry Host.
std::optional<Rejection> check_request_header(const RequestParser& parser);

// The parsed message as a handler's Request (lower-case header names).
Request to_request(boost::beast::http::request<boost::beast::http::string_body>&& message);

// A complete error response in OpenAI's error format, with "Connection: close".
std::string rejection_response(const Rejection& rejection);

}  // namespace m3::server::http
