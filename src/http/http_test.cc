#include "http/http.h"

#include <zlib.h>

#include <string>

#include <gtest/gtest.h>

namespace trellis::http {
namespace {

HttpLimits Small() {
  HttpLimits l;
  l.max_body = 1000;
  l.max_decoded_body = 2000;
  l.max_header = 512;
  return l;
}

std::string Gzip(const std::string& in, int window_bits = 16 + MAX_WBITS) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, in.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

int StatusOf(const std::variant<HttpRequest, HttpError>& r) {
  return r.index() == 0 ? 200 : std::get<1>(r).status;
}

TEST(Http, ParsesAWholeRequest) {
  auto r = ParseRequestBytes("POST /v1/x?y=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nX-Request-Id: abc-1\r\n\r\n{}",
                             Small());
  ASSERT_EQ(r.index(), 0u) << std::get<1>(r).message;
  const HttpRequest& q = std::get<0>(r);
  EXPECT_EQ(q.method, "POST");
  EXPECT_EQ(q.path, "/v1/x");
  EXPECT_EQ(q.body, "{}");
  EXPECT_EQ(q.Header("host"), "a");
  EXPECT_EQ(q.request_id, "abc-1");
}

TEST(Http, ChunkedBodiesAreBoundedLikeDeclaredOnes) {
  std::string chunk(600, 'a');
  std::string req = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 2; ++i) req += "258\r\n" + chunk + "\r\n";  // 0x258 = 600
  req += "0\r\n\r\n";
  EXPECT_EQ(StatusOf(ParseRequestBytes(req, Small())), 413);
  EXPECT_EQ(StatusOf(ParseRequestBytes("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", Small())), 413);
}

TEST(Http, RefusesSmugglingShapes) {
  EXPECT_EQ(StatusOf(ParseRequestBytes(
                "POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", Small())),
            400);
  EXPECT_EQ(StatusOf(ParseRequestBytes("POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
                                       Small())),
            400);
  EXPECT_EQ(StatusOf(ParseRequestBytes("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", Small())), 501);
  EXPECT_EQ(StatusOf(ParseRequestBytes("GET http://evil/ HTTP/1.1\r\n\r\n", Small())), 400);
  EXPECT_EQ(StatusOf(ParseRequestBytes("GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", Small())),
            400);
}

TEST(Http, OversizeHeadIs431) {
  std::string req = "GET / HTTP/1.1\r\nX-Big: " + std::string(1000, 'x') + "\r\n\r\n";
  EXPECT_EQ(StatusOf(ParseRequestBytes(req, Small())), 431);
}

TEST(Http, TruncatedBodyIsRefused) {
  EXPECT_EQ(StatusOf(ParseRequestBytes("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}", Small())), 400);
}

TEST(Http, DecodesGzipAndDeflate) {
  const std::string text = R"({"prompt":"hello hello hello"})";
  for (auto [ce, bits] : {std::pair{"gzip", 16 + MAX_WBITS}, std::pair{"deflate", MAX_WBITS},
                          std::pair{"deflate", -MAX_WBITS}}) {
    std::string body = Gzip(text, bits);
    EXPECT_EQ(DecodeBody(ce, body, 2000), std::nullopt) << ce << " " << bits;
    EXPECT_EQ(body, text);
  }
}

TEST(Http, DecompressionBombStopsAtTheBound) {
  std::string body = Gzip(std::string(64 << 20, '\0'));  // 64 MiB of zeros, ~65 KB compressed
  ASSERT_LT(body.size(), 100u << 10);
  auto e = DecodeBody("gzip", body, 1 << 20);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 413);
}

TEST(Http, CorruptOrTruncatedOrUnknownCodings) {
  std::string good = Gzip("{\"a\":1}");
  std::string truncated = good.substr(0, good.size() / 2);
  EXPECT_EQ(DecodeBody("gzip", truncated, 2000)->status, 400);
  std::string garbage = "not gzip at all";
  EXPECT_EQ(DecodeBody("gzip", garbage, 2000)->status, 400);
  std::string trailing = good + "xx";
  EXPECT_EQ(DecodeBody("gzip", trailing, 2000)->status, 400);
  std::string brotli_junk = "\xff\xff\xff\xff";
  EXPECT_EQ(DecodeBody("br", brotli_junk, 2000)->status, 400);
  std::string any = "x";
  EXPECT_EQ(DecodeBody("zstd", any, 2000)->status, 415);
  EXPECT_EQ(DecodeBody("gzip, br", any, 2000)->status, 415);
  std::string big(3000, 'a');
  EXPECT_EQ(DecodeBody("identity", big, 2000)->status, 413);
}

TEST(Http, RequestIdsAreSanitized) {
  EXPECT_EQ(PickRequestId("abc-123"), "abc-123");
  EXPECT_NE(PickRequestId("bad id"), "bad id");
  EXPECT_NE(PickRequestId(std::string(200, 'a')), std::string(200, 'a'));
  EXPECT_EQ(PickRequestId("").size(), 16u);
  EXPECT_NE(NewRequestId(), NewRequestId());
}

TEST(Http, SerializesResponses) {
  HttpResponse r;
  r.status = 503;
  r.body = "{}";
  r.headers.emplace_back("Retry-After", "1");
  const std::string s = SerializeResponse(r, "rid", false);
  EXPECT_EQ(s.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u);
  EXPECT_NE(s.find("Content-Length: 2\r\n"), std::string::npos);
  EXPECT_NE(s.find("Retry-After: 1\r\n"), std::string::npos);
  EXPECT_NE(s.find("x-request-id: rid\r\n"), std::string::npos);
  EXPECT_NE(s.find("Connection: close\r\n"), std::string::npos);
}

}  // namespace
}  // namespace trellis::http
