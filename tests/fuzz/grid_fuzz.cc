// libFuzzer target for a grid node's message decoding (built only with -DTRELLIS_FUZZ=ON
// and clang): what a head, or anyone who reaches a node's port, can send.
//
// The first byte picks the message (its value mod 4): 0 a Step checked against a fixed
// geometry (the node's agreement with its head at Hello); 1 a Hello; 2 a store Fetch; 3 a
// Read. A refused message must carry a message. An accepted Step must satisfy everything
// the node's compute relies on: block ids inside the pool, every sequence's table
// covering its positions within the context, at most the agreed sequences and tokens, the
// rows adding up, copies inside the pool with at most a block's slots, and a hidden state
// of exactly rows x n_embd x 4 bytes lying inside the input. An accepted Hello must hold a
// sane geometry. An accepted Fetch names pool blocks only, within the prefix its runs
// describe, with a block geometry the node can cut; an accepted Read names pool blocks
// only. Any violation aborts.
//
// Run: grid_fuzz -max_total_time=300 -max_len=4096 /tmp/new-corpus tests/data/grid_corpus
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "grid/protocol.h"
#include "kernels/attention.h"

namespace trellis::grid {
namespace {

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "grid_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

constexpr uint32_t kEmbd = 16;

HelloRequest Geometry() {
  HelloRequest g;
  g.n_layer = 4;
  g.first_layer = 1;
  g.last_layer = 3;
  g.block_size = 8;
  g.n_blocks = 12;
  g.max_batch_tokens = 64;
  g.max_seqs = 4;
  g.n_ctx = 96;
  return g;
}

void CheckStep(std::string_view body) {
  static const HelloRequest g = Geometry();
  StepRequest s;
  const Status st = DecodeStep(body, g, kEmbd, s);
  if (!st.ok()) {
    FUZZ_CHECK(!st.message().empty());
    return;
  }
  FUZZ_CHECK(s.seqs.size() <= g.max_seqs);
  uint64_t rows = 0;
  for (const StepSeq& q : s.seqs) {
    FUZZ_CHECK(q.pos0 >= 0 && q.n_tokens >= 1);
    const int64_t end = static_cast<int64_t>(q.pos0) + q.n_tokens;
    FUZZ_CHECK(end <= static_cast<int64_t>(g.n_ctx));
    FUZZ_CHECK(static_cast<int64_t>(q.table.size()) * g.block_size >= end);
    for (int32_t b : q.table) FUZZ_CHECK(b >= 0 && static_cast<uint32_t>(b) < g.n_blocks);
    rows += static_cast<uint64_t>(q.n_tokens);
  }
  FUZZ_CHECK(rows <= g.max_batch_tokens && rows == s.n_rows);
  for (const auto& c : s.copies) {
    FUZZ_CHECK(c[0] >= 0 && c[1] >= 0 && c[0] != c[1]);
    FUZZ_CHECK(static_cast<uint32_t>(c[0]) < g.n_blocks && static_cast<uint32_t>(c[1]) < g.n_blocks);
    FUZZ_CHECK(c[2] >= 0 && static_cast<uint32_t>(c[2]) <= g.block_size);
  }
  FUZZ_CHECK(s.hidden.size() == rows * kEmbd * sizeof(float));
  FUZZ_CHECK(s.hidden.data() >= body.data() && s.hidden.data() + s.hidden.size() == body.data() + body.size());
}

void CheckHello(std::string_view body) {
  HelloRequest h;
  const Status st = DecodeHello(body, h);
  if (!st.ok()) {
    FUZZ_CHECK(!st.message().empty());
    return;
  }
  FUZZ_CHECK(h.version == kProtocolVersion);
  trellis::KvType k, v;
  FUZZ_CHECK(trellis::KvTypesFromCode(h.kv_types, &k, &v));  // a pool the node can lay out
  FUZZ_CHECK(h.first_layer < h.last_layer && h.last_layer <= h.n_layer);
  FUZZ_CHECK(h.block_size >= 1 && h.block_size <= 4096 && h.n_blocks >= 1 && h.n_blocks <= (1u << 30));
  FUZZ_CHECK(h.max_batch_tokens >= 1 && h.max_batch_tokens <= kMaxBatchTokens && h.max_seqs >= 1 && h.max_seqs <= kMaxSeqs);
  // What is accepted encodes back to the same bytes.
  FUZZ_CHECK(EncodeHello(h) == body);
}

void CheckFetch(std::string_view body) {
  static const HelloRequest g = Geometry();
  FetchRequest f;
  const Status st = DecodeFetch(body, g.n_blocks, f);
  if (!st.ok()) {
    FUZZ_CHECK(!st.message().empty());
    return;
  }
  uint64_t sum = 0;
  for (const store::Run& r : f.runs) sum += r.count;
  FUZZ_CHECK(sum == f.found_blocks);
  FUZZ_CHECK(!f.ids.empty() && uint64_t{f.first} + f.ids.size() <= f.found_blocks);
  for (int32_t id : f.ids) FUZZ_CHECK(id >= 0 && static_cast<uint32_t>(id) < g.n_blocks);
  FUZZ_CHECK(f.deadline_ms >= 1 && f.deadline_ms <= 600000);
  FUZZ_CHECK(f.slices >= 1 && f.block_bytes >= 1 && f.block_bytes % f.slices == 0);
  FUZZ_CHECK(EncodeFetch(f) == body);
}

void CheckRead(std::string_view body) {
  static const HelloRequest g = Geometry();
  ReadRequest r;
  const Status st = DecodeRead(body, g.n_blocks, r);
  if (!st.ok()) {
    FUZZ_CHECK(!st.message().empty());
    return;
  }
  for (int32_t id : r.ids) FUZZ_CHECK(id >= 0 && static_cast<uint32_t>(id) < g.n_blocks);
  FUZZ_CHECK(EncodeRead(r) == body);
}

}  // namespace
}  // namespace trellis::grid

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: trellis::grid::CheckStep(body); break;
    case 1: trellis::grid::CheckHello(body); break;
    case 2: trellis::grid::CheckFetch(body); break;
    default: trellis::grid::CheckRead(body); break;
  }
  return 0;
}
