#include "http/http.h"

#include <brotli/decode.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <random>

#include <fmt/core.h>

#include <boost/asio/buffer.hpp>

#include "http/beast.h"

namespace trellis::http {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

HttpError TooLarge(size_t max) {
  return {413, fmt::format("the request body is larger than {} bytes once decompressed (--max-decoded-body)", max)};
}

constexpr size_t kChunk = 64 << 10;

// zlib (gzip or zlib-wrapped deflate; raw deflate when `raw`), output bounded by `max`.
std::optional<HttpError> Inflate(std::string& body, size_t max, int window_bits, std::string& out) {
  z_stream z{};
  if (inflateInit2(&z, window_bits) != Z_OK) return HttpError{500, "cannot start the decompressor"};
  std::unique_ptr<z_stream, void (*)(z_stream*)> guard(&z, [](z_stream* p) { inflateEnd(p); });
  z.next_in = reinterpret_cast<Bytef*>(body.data());
  z.avail_in = static_cast<uInt>(body.size());  // body.size() <= max_body, far below 4 GiB
  out.clear();
  for (;;) {
    const size_t have = out.size();
    const size_t room = std::min(kChunk, max + 1 - have);  // one byte past max proves "too large"
    out.resize(have + room);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + have);
    z.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&z, Z_NO_FLUSH);
    out.resize(have + (room - z.avail_out));
    if (out.size() > max) return TooLarge(max);
    if (rc == Z_STREAM_END) {
      if (z.avail_in != 0) return HttpError{400, "the compressed body has trailing bytes after its end"};
      return std::nullopt;
    }
    if (rc == Z_BUF_ERROR && z.avail_in == 0) return HttpError{400, "the compressed body is truncated"};
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return HttpError{400, std::string("the compressed body is corrupt: ") + (z.msg ? z.msg : "inflate error")};
    }
  }
}

std::optional<HttpError> Unbrotli(const std::string& body, size_t max, std::string& out) {
  std::unique_ptr<BrotliDecoderState, void (*)(BrotliDecoderState*)> st(
      BrotliDecoderCreateInstance(nullptr, nullptr, nullptr), BrotliDecoderDestroyInstance);
  if (!st) return HttpError{500, "cannot start the decompressor"};
  size_t avail_in = body.size();
  const uint8_t* next_in = reinterpret_cast<const uint8_t*>(body.data());
  out.clear();
  for (;;) {
    const size_t have = out.size();
    const size_t room = std::min(kChunk, max + 1 - have);
    out.resize(have + room);
    size_t avail_out = room;
    uint8_t* next_out = reinterpret_cast<uint8_t*>(out.data() + have);
    const BrotliDecoderResult rc =
        BrotliDecoderDecompressStream(st.get(), &avail_in, &next_in, &avail_out, &next_out, nullptr);
    out.resize(have + (room - avail_out));
    if (out.size() > max) return TooLarge(max);
    switch (rc) {
      case BROTLI_DECODER_RESULT_SUCCESS:
        if (avail_in != 0) return HttpError{400, "the compressed body has trailing bytes after its end"};
        return std::nullopt;
      case BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT:
        continue;
      case BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT:
        return HttpError{400, "the compressed body is truncated"};
      default:
        return HttpError{400, std::string("the compressed body is corrupt: ") +
                                  BrotliDecoderErrorString(BrotliDecoderGetErrorCode(st.get()))};
    }
  }
}

bool ValidTarget(std::string_view t) {
  if (t.empty() || t.front() != '/') return false;
  return std::all_of(t.begin(), t.end(), [](char c) { return static_cast<unsigned char>(c) > 0x20 && c != 0x7f; });
}

}  // namespace

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return v;
  }
  return {};
}

bool HttpRequest::HasHeader(std::string_view name) const {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& kv) { return IEquals(kv.first, name); });
}

std::string_view StatusReason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

namespace {
void AppendHeaders(std::string& out, const std::vector<std::pair<std::string, std::string>>& headers,
                   const std::string& request_id, bool keep_alive) {
  for (const auto& [k, v] : headers) out += fmt::format("{}: {}\r\n", k, v);
  if (!request_id.empty()) out += fmt::format("x-request-id: {}\r\n", request_id);
  if (!keep_alive) out += "Connection: close\r\n";
}
}  // namespace

std::string SerializeResponse(const HttpResponse& r, const std::string& request_id, bool keep_alive) {
  std::string out = fmt::format("HTTP/1.1 {} {}\r\n", r.status, StatusReason(r.status));
  if (!r.content_type.empty()) out += fmt::format("Content-Type: {}\r\n", r.content_type);
  out += fmt::format("Content-Length: {}\r\n", r.body.size());
  AppendHeaders(out, r.headers, request_id, keep_alive);
  out += "\r\n";
  out += r.body;
  return out;
}

std::string SerializeStreamHead(int status, std::string_view content_type,
                                const std::vector<std::pair<std::string, std::string>>& headers,
                                const std::string& request_id, bool keep_alive) {
  std::string out = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nTransfer-Encoding: chunked\r\n", status,
                                StatusReason(status), content_type);
  AppendHeaders(out, headers, request_id, keep_alive);
  out += "\r\n";
  return out;
}

std::optional<HttpError> CheckHead(const HttpRequest& head, std::optional<uint64_t> content_length,
                                   const HttpLimits& limits) {
  if (!ValidTarget(head.target)) return HttpError{400, "the request target must be an absolute path ('/...')"};
  if (head.version != 10 && head.version != 11) return HttpError{505, "only HTTP/1.0 and HTTP/1.1 are served"};
  const bool has_te = head.HasHeader("Transfer-Encoding");
  if (has_te && head.HasHeader("Content-Length")) {
    return HttpError{400, "a request must not carry both Content-Length and Transfer-Encoding"};
  }
  if (has_te && !IEquals(Trim(head.Header("Transfer-Encoding")), "chunked")) {
    return HttpError{501, "the only Transfer-Encoding accepted is 'chunked'"};
  }
  if (content_length && *content_length > limits.max_body) {
    return HttpError{413, fmt::format("the request body of {} bytes is larger than {} bytes (--max-body)",
                                      *content_length, limits.max_body)};
  }
  const std::string_view ce = Trim(head.Header("Content-Encoding"));
  if (!ce.empty() && !IEquals(ce, "identity") && !IEquals(ce, "gzip") && !IEquals(ce, "x-gzip") &&
      !IEquals(ce, "deflate") && !IEquals(ce, "br")) {
    return HttpError{415, "unsupported Content-Encoding (accepted: gzip, deflate, br, identity; one coding)"};
  }
  return std::nullopt;
}

std::optional<HttpError> DecodeBody(std::string_view content_encoding, std::string& body, size_t max_decoded) {
  const std::string_view ce = Trim(content_encoding);
  if (ce.empty() || IEquals(ce, "identity")) {
    if (body.size() > max_decoded) return TooLarge(max_decoded);
    return std::nullopt;
  }
  std::string out;
  std::optional<HttpError> err;
  if (IEquals(ce, "gzip") || IEquals(ce, "x-gzip")) {
    err = Inflate(body, max_decoded, 16 + MAX_WBITS, out);
  } else if (IEquals(ce, "deflate")) {
    // RFC 9110's "deflate" is the zlib format; some clients send raw deflate: accept both.
    err = Inflate(body, max_decoded, MAX_WBITS, out);
    if (err && err->status == 400) err = Inflate(body, max_decoded, -MAX_WBITS, out);
  } else if (IEquals(ce, "br")) {
    err = Unbrotli(body, max_decoded, out);
  } else {
    return HttpError{415, "unsupported Content-Encoding (accepted: gzip, deflate, br, identity; one coding)"};
  }
  if (err) return err;
  body = std::move(out);
  return std::nullopt;
}

std::string NewRequestId() {
  thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  return fmt::format("{:016x}", rng());
}

std::string PickRequestId(std::string_view given) {
  const bool ok = !given.empty() && given.size() <= 128 && std::all_of(given.begin(), given.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-';
  });
  return ok ? std::string(given) : NewRequestId();
}

namespace detail {

void ConfigureParser(RequestParser& p, const HttpLimits& limits) {
  p.header_limit(static_cast<std::uint32_t>(std::min<size_t>(limits.max_header, UINT32_MAX)));
  p.body_limit(limits.max_body);
}

HttpRequest HeadFromParser(const RequestParser& p) {
  const auto& m = p.get();
  HttpRequest r;
  r.method = std::string(m.method_string());
  r.target = std::string(m.target());
  r.path = r.target.substr(0, r.target.find('?'));
  r.version = static_cast<int>(m.version());
  r.headers.reserve(16);
  for (const auto& f : m) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  r.keep_alive = p.keep_alive();
  return r;
}

HttpError ParseErrorToHttp(const boost::beast::error_code& ec) {
  if (ec == bhttp::error::header_limit) return {431, "the request head is too large (limit 16 KiB)"};
  if (ec == bhttp::error::body_limit) return {413, "the request body is too large (--max-body)"};
  return {400, "malformed HTTP request: " + ec.message()};
}

}  // namespace detail

std::variant<HttpRequest, HttpError> ParseRequestBytes(std::string_view raw, const HttpLimits& limits) {
  detail::RequestParser p;
  detail::ConfigureParser(p, limits);
  p.eager(false);  // stop after the head, as the server does, so CheckHead runs first
  boost::beast::error_code ec;
  size_t off = 0;
  auto feed = [&]() {
    while (off < raw.size()) {
      const size_t n = p.put(boost::asio::const_buffer(raw.data() + off, raw.size() - off), ec);
      off += n;
      if (ec == detail::bhttp::error::need_more) {
        ec = {};
        if (n == 0) return;  // wants bytes we do not have
        continue;
      }
      if (ec || p.is_header_done()) return;
    }
  };
  feed();
  if (ec) return detail::ParseErrorToHttp(ec);
  if (!p.is_header_done()) return HttpError{400, "incomplete request head"};
  HttpRequest req = detail::HeadFromParser(p);
  auto cl = p.content_length();
  if (auto e = CheckHead(req, cl ? std::optional<uint64_t>(*cl) : std::nullopt, limits)) return *e;
  p.eager(true);
  while (!p.is_done()) {
    const size_t before = off;
    feed();
    if (ec) return detail::ParseErrorToHttp(ec);
    if (p.is_done()) break;
    if (off == before || off >= raw.size()) {
      p.put_eof(ec);
      if (ec) return HttpError{400, "incomplete request body: " + ec.message()};
      break;
    }
  }
  req.body = std::move(p.get().body());
  if (auto e = DecodeBody(req.Header("Content-Encoding"), req.body, limits.max_decoded_body)) return *e;
  req.request_id = PickRequestId(req.Header("X-Request-Id"));
  return req;
}

}  // namespace trellis::http
