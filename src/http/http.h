// HTTP/1.1 for `trellis serve`: request types, limits and the bounded body decoder.
//
// Everything here treats the bytes it is given as hostile. A request goes through three
// gates, each bounded before any work is done past it:
//   1. the head (request line and headers): at most HttpLimits::max_header bytes, and it
//      must arrive whole within header_timeout (a total deadline, not per read, so a
//      client that trickles one header line at a time is cut off);
//   2. the routing decision on the head alone (404/405, authentication, a declared
//      Content-Length over max_body, an unknown Content-Encoding): refused requests are
//      answered before their body is read;
//   3. the body: at most max_body bytes as sent, Content-Length or chunked alike, within
//      body_timeout; then gzip/deflate/br are decoded with an output bound of
//      max_decoded_body (a 65 KB gzip bomb stops at the bound, not at 64 MB).
// The HTTP parser is Boost.Beast's (Debian's libboost-dev); the socket handling is in
// server.h. docs/server.md says why Beast and lists the limits with their flags.
//
// Thread safety: free functions over values.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace trellis::http {

struct HttpLimits {
  size_t max_header = 16 << 10;        // request line + headers; over it: 431
  size_t max_body = 8 << 20;           // body bytes as sent; over it: 413
  size_t max_decoded_body = 8 << 20;   // body bytes after Content-Encoding; over it: 413
  std::chrono::milliseconds header_timeout{10'000};  // whole head, from its first byte
  std::chrono::milliseconds body_timeout{30'000};    // whole body
  std::chrono::milliseconds idle_timeout{5'000};     // keep-alive wait for the next request
  std::chrono::milliseconds write_timeout{30'000};   // one write blocked on a client that does not read
  int max_connections = 1024;                        // open client connections; beyond: 503
};

// An HTTP-level refusal: status and a message for the OpenAI-shaped error body.
struct HttpError {
  int status = 400;
  std::string message;
};

struct HttpRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;    // target up to '?'
  int version = 11;    // 10 or 11
  std::vector<std::pair<std::string, std::string>> headers;  // names as sent
  std::string body;    // decoded (after Content-Encoding)
  std::string remote;  // peer address, for the log
  std::string request_id;
  bool keep_alive = true;

  // The first header of that name (case-insensitive), or "".
  std::string_view Header(std::string_view name) const;
  bool HasHeader(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

// "HTTP/1.1 200 OK\r\n...\r\n\r\n" with Content-Length, Content-Type, x-request-id and
// Connection: close when !keep_alive.
std::string SerializeResponse(const HttpResponse& r, const std::string& request_id, bool keep_alive);
// The head of a chunked response (Transfer-Encoding: chunked).
std::string SerializeStreamHead(int status, std::string_view content_type,
                                const std::vector<std::pair<std::string, std::string>>& headers,
                                const std::string& request_id, bool keep_alive);
std::string_view StatusReason(int status);
// ASCII case-insensitive equality (header names, codings, auth schemes).
bool IEquals(std::string_view a, std::string_view b);

// Checks on a complete head, before the body is read: method and target shape, both
// Content-Length and Transfer-Encoding (400: request smuggling), declared length over
// max_body (413), Content-Encoding other than identity/gzip/deflate/br (415).
std::optional<HttpError> CheckHead(const HttpRequest& head, std::optional<uint64_t> content_length,
                                   const HttpLimits& limits);

// Decodes `body` in place according to Content-Encoding (identity, gzip, x-gzip,
// deflate, br; one coding). 413 when the decoded size would pass max_decoded, 415 for an
// unknown coding, 400 for a corrupt stream or trailing garbage.
std::optional<HttpError> DecodeBody(std::string_view content_encoding, std::string& body, size_t max_decoded);

// The request id: the client's X-Request-Id when it is 1..128 characters of
// [A-Za-z0-9._:-], else a fresh random one (never the client's bytes raw).
std::string PickRequestId(std::string_view given);
std::string NewRequestId();

// One whole request from raw bytes through the same parser settings, checks and decoder
// as the server (for tests and the fuzzer). Bytes after the first request are ignored.
std::variant<HttpRequest, HttpError> ParseRequestBytes(std::string_view raw, const HttpLimits& limits);

}  // namespace trellis::http
