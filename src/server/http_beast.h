// Glue between Boost.Beast's request parser and the types of http.h, shared by the
// byte-level parser (http.cc, fuzzed) and the socket server (http_server.cc), so both
// configure and read the parser the same way. Internal to src/server.
#pragma once

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "server/http.h"

namespace trellis::server::detail {

namespace http = boost::beast::http;
using RequestParser = http::request_parser<http::string_body>;

// Header and body limits from `limits`; the body limit applies to chunked bodies too.
void ConfigureParser(RequestParser& p, const HttpLimits& limits);
// Method, target, version, headers and keep-alive of a parsed head.
HttpRequest HeadFromParser(const RequestParser& p);
// The answer to a parse error: 431 (head too large), 413 (body too large), else 400.
HttpError ParseErrorToHttp(const boost::beast::error_code& ec);

}  // namespace trellis::server::detail
