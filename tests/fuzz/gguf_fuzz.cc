// libFuzzer target for the GGUF reader (built only with -DTRELLIS_FUZZ=ON and clang).
//
// Parses the input with GgufFile::Parse. On success it reads every metadata value and
// the first and last byte of every tensor's data, so AddressSanitizer flags any pointer
// or length the parser let through that is not inside the input. It then checks the
// invariants the header promises (sizes consistent, data inside the buffer and aligned,
// no two tensors overlapping) and that writing the parsed file back out with GgufWriter
// and parsing it again gives the same metadata and tensors. Any violation aborts.
//
// Run: gguf_fuzz -max_total_time=300 /tmp/new-corpus tests/data/gguf_corpus
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace trellis {
namespace {

#define FUZZ_CHECK(cond)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "gguf_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

// Reads every byte-carrying member of a value; the returned sum keeps the reads alive.
uint64_t Touch(const GgufValue& v) {
  uint64_t sum = v.u64 + static_cast<uint64_t>(v.i64) + v.count;
  sum += std::isnan(v.f64) ? 1 : 0;
  for (char ch : v.str) sum += static_cast<uint8_t>(ch);
  for (int64_t x : v.ints) sum += static_cast<uint64_t>(x);
  for (double x : v.floats) sum += std::isnan(x) ? 1 : 0;
  for (const std::string& s : v.strings) {
    sum += s.size();
    if (!s.empty()) sum += static_cast<uint8_t>(s.front()) + static_cast<uint8_t>(s.back());
  }
  for (const GgufValue& n : v.nested) sum += Touch(n);
  if (v.type == GgufValueType::kArray) {
    // Exactly one element vector is filled, and it holds `count` elements.
    const uint64_t held = v.ints.size() + v.floats.size() + v.strings.size() + v.nested.size();
    FUZZ_CHECK(held == v.count);
  }
  sum += v.ToString().size();
  return sum;
}

bool SameDouble(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

bool SameValue(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type || a.u64 != b.u64 || a.i64 != b.i64 || !SameDouble(a.f64, b.f64) || a.str != b.str ||
      a.elem_type != b.elem_type || a.count != b.count || a.ints != b.ints || a.strings != b.strings ||
      a.floats.size() != b.floats.size() || a.nested.size() != b.nested.size()) {
    return false;
  }
  for (size_t i = 0; i < a.floats.size(); ++i) {
    if (!SameDouble(a.floats[i], b.floats[i])) return false;
  }
  for (size_t i = 0; i < a.nested.size(); ++i) {
    if (!SameValue(a.nested[i], b.nested[i])) return false;
  }
  return true;
}

uint64_t CheckParsed(const GgufFile& g, std::span<const uint8_t> bytes) {
  uint64_t sum = g.version() + g.alignment() + g.data_offset();
  FUZZ_CHECK(g.version() == 2 || g.version() == 3);
  FUZZ_CHECK(g.alignment() > 0 && (g.alignment() & (g.alignment() - 1)) == 0);
  for (const auto& [key, v] : g.metadata()) {
    FUZZ_CHECK(g.Find(key) == &v);
    sum += key.size() + Touch(v);
    // The typed getters must answer (value or error) for any stored type.
    sum += g.GetString(key).ok() + g.GetUint(key).ok() + g.GetFloat(key).ok() + g.GetBool(key).ok();
    sum += g.GetArray(key, GgufValueType::kInt32).ok() + g.GetArray(key, GgufValueType::kString).ok() +
           g.GetArray(key, GgufValueType::kFloat32).ok();
  }
  const uint8_t* begin = bytes.data();
  const uint8_t* end = bytes.data() + bytes.size();
  for (const GgufTensorInfo& t : g.tensors()) {
    FUZZ_CHECK(g.FindTensor(t.name) == &t);
    FUZZ_CHECK(!t.dims.empty() && t.dims.size() <= 4);
    int64_t n = 1;
    for (int64_t d : t.dims) {
      FUZZ_CHECK(d > 0);
      n *= d;
    }
    FUZZ_CHECK(n == t.n_elements);
    FUZZ_CHECK(t.size_bytes > 0);
    FUZZ_CHECK(static_cast<int64_t>(t.size_bytes) == RowBytes(t.type, t.dims[0]) * (n / t.dims[0]));
    FUZZ_CHECK(t.data >= begin && t.data + t.size_bytes <= end);
    FUZZ_CHECK(static_cast<uint64_t>(t.data - begin) == g.data_offset() + t.offset);
    FUZZ_CHECK(static_cast<uint64_t>(t.data - begin) % g.alignment() == 0);
    // These two reads are what ASan watches: the input buffer has no slack around it.
    sum += t.data[0] + t.data[t.size_bytes - 1];
    for (const GgufTensorInfo& u : g.tensors()) {
      if (&u == &t) continue;
      FUZZ_CHECK(t.data + t.size_bytes <= u.data || u.data + u.size_bytes <= t.data);
    }
  }
  return sum;
}

// Writes `g` back out and parses the result: the metadata and tensors must survive.
void CheckRoundTrip(const GgufFile& g) {
  GgufWriter w(g.alignment());
  for (const auto& [key, v] : g.metadata()) w.SetValue(key, v);
  for (const GgufTensorInfo& t : g.tensors()) {
    FUZZ_CHECK(w.AddTensorData(t.name, t.dims, t.type, {t.data, t.size_bytes}).ok());
  }
  auto buf = w.WriteToBuffer();
  FUZZ_CHECK(buf.ok());
  auto again = GgufFile::Parse(*buf);
  if (!again.ok()) std::fprintf(stderr, "gguf_fuzz: re-parse failed: %s\n", again.status().ToString().c_str());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->alignment() == g.alignment());
  FUZZ_CHECK(again->metadata().size() == g.metadata().size());
  for (const auto& [key, v] : g.metadata()) {
    const GgufValue* w2 = again->Find(key);
    FUZZ_CHECK(w2 != nullptr);
    FUZZ_CHECK(SameValue(v, *w2));
  }
  FUZZ_CHECK(again->tensors().size() == g.tensors().size());
  for (const GgufTensorInfo& t : g.tensors()) {
    const GgufTensorInfo* u = again->FindTensor(t.name);
    FUZZ_CHECK(u != nullptr && u->dims == t.dims && u->type == t.type && u->size_bytes == t.size_bytes);
    FUZZ_CHECK(std::memcmp(u->data, t.data, t.size_bytes) == 0);
  }
}

}  // namespace
}  // namespace trellis

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = trellis::GgufFile::Parse({data, size});
  if (!g.ok()) {
    FUZZ_CHECK(!g.status().message().empty());
    return 0;
  }
  volatile uint64_t sink = trellis::CheckParsed(*g, {data, size});
  (void)sink;
  trellis::CheckRoundTrip(*g);
  return 0;
}
