// Glue between Boost.Beast's request parser and the types of http.h, shared by the
// byte-level parser (http.cc, fuzzed) and the socket server (server.cc), so both
// configure and read the parser the same way. Internal to src/http.
#pragma once

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "http/http.h"

namespace trellis::http::detail {

namespace bhttp = boost::beast::http;
using RequestParser = bhttp::request_parser<bhttp::string_body>;

// Header and body limits from `limits`; the body limit applies to chunked bodies too.
void ConfigureParser(RequestParser& p, const HttpLimits& limits);
// Method, target, version, headers and keep-alive of a parsed head.
HttpRequest HeadFromParser(const RequestParser& p);
// The answer to a parse error: 431 (head too large), 413 (body too large), else 400.
HttpError ParseErrorToHttp(const boost::beast::error_code& ec);

}  // namespace trellis::http::detail
