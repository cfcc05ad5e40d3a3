// libFuzzer target for the HTTP request reader (built only with -DTRELLIS_FUZZ=ON and clang).
//
// Feeds the input as raw bytes to ParseRequestBytes, the same Beast parser settings, head
// checks and bounded Content-Encoding decoder the server applies to a socket, with small
// limits so the bounds are reached. A refusal must carry an HTTP error status and a
// message; an accepted request must respect every bound (decoded body size, a target that
// starts with '/', a sanitized request id) and serialize an answer without trouble.
//
// Run: http_fuzz -max_total_time=300 -dict=tests/data/http_corpus.dict /tmp/new tests/data/http_corpus
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "http/http.h"

namespace trellis::http {
namespace {

#define FUZZ_CHECK(cond)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "http_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

void Check(std::string_view raw) {
  HttpLimits limits;
  limits.max_header = 4096;
  limits.max_body = 8192;
  limits.max_decoded_body = 65536;
  auto r = ParseRequestBytes(raw, limits);
  if (r.index() == 1) {
    const HttpError& e = std::get<1>(r);
    FUZZ_CHECK(e.status >= 400 && e.status <= 505);
    FUZZ_CHECK(!e.message.empty());
    return;
  }
  const HttpRequest& q = std::get<0>(r);
  FUZZ_CHECK(!q.target.empty() && q.target[0] == '/');
  FUZZ_CHECK(q.path.size() <= q.target.size());
  FUZZ_CHECK(q.body.size() <= limits.max_decoded_body);
  FUZZ_CHECK(q.version == 10 || q.version == 11);
  FUZZ_CHECK(!q.request_id.empty() && q.request_id.size() <= 128);
  for (char c : q.request_id) FUZZ_CHECK(c > 0x20 && c < 0x7f);
  HttpResponse res;
  res.body = q.body;
  const std::string out = SerializeResponse(res, q.request_id, q.keep_alive);
  FUZZ_CHECK(out.size() >= res.body.size());
}

}  // namespace
}  // namespace trellis::http

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trellis::http::Check(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
