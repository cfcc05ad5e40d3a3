#include "grid/protocol.h"

#include <algorithm>

#include <fmt/core.h>

#include "kernels/attention.h"
#include "net/wire.h"

namespace trellis::grid {

std::string EncodeHello(const HelloRequest& h) {
  net::WireWriter w;
  w.U32(h.version);
  w.U64(h.head_id);
  w.U64(h.fingerprint);
  for (uint32_t v : {h.n_layer, h.first_layer, h.last_layer, h.block_size, h.n_blocks, h.max_batch_tokens, h.max_seqs, h.n_ctx,
                     h.store, h.kv_types}) {
    w.U32(v);
  }
  return w.Take();
}

Status DecodeHello(std::string_view body, HelloRequest& h) {
  net::WireReader rd(body);
  h.version = rd.U32();
  if (rd.ok() && h.version != kProtocolVersion) {
    return InvalidArgument(fmt::format("grid protocol version {} (this node speaks {})", h.version, kProtocolVersion));
  }
  h.head_id = rd.U64();
  h.fingerprint = rd.U64();
  for (uint32_t* v : {&h.n_layer, &h.first_layer, &h.last_layer, &h.block_size, &h.n_blocks, &h.max_batch_tokens,
                      &h.max_seqs, &h.n_ctx, &h.store, &h.kv_types}) {
    *v = rd.U32();
  }
  if (!rd.Done()) return Corrupt("malformed grid hello");
  if (h.first_layer >= h.last_layer || h.last_layer > h.n_layer) {
    return InvalidArgument(fmt::format("grid hello: layer range {}-{} of {} layers", h.first_layer, h.last_layer, h.n_layer));
  }
  if (h.block_size < 1 || h.block_size > 4096 || h.n_blocks < 1 || h.n_blocks > (1u << 30) || h.max_batch_tokens < 1 ||
      h.max_batch_tokens > kMaxBatchTokens || h.max_seqs < 1 || h.max_seqs > kMaxSeqs || h.n_ctx < 1 ||
      h.n_ctx > (1u << 24) || h.store > 1) {
    return InvalidArgument("grid hello: geometry out of range");
  }
  KvType k, v;
  if (!KvTypesFromCode(h.kv_types, &k, &v)) return InvalidArgument(fmt::format("grid hello: K/V type code {:#x} is unknown", h.kv_types));
  return Status::Ok();
}

std::string EncodeHelloReply(const HelloReply& r) {
  net::WireWriter w;
  w.U64(r.fingerprint);
  w.U32(r.first_layer);
  w.U32(r.last_layer);
  w.U32(r.threads);
  w.U64(r.weight_bytes);
  w.U64(r.kv_pool_bytes);
  return w.Take();
}

Status DecodeHelloReply(std::string_view body, HelloReply& r) {
  net::WireReader rd(body);
  r.fingerprint = rd.U64();
  r.first_layer = rd.U32();
  r.last_layer = rd.U32();
  r.threads = rd.U32();
  r.weight_bytes = rd.U64();
  r.kv_pool_bytes = rd.U64();
  if (!rd.Done()) return Corrupt("malformed grid hello reply");
  return Status::Ok();
}

std::string EncodeFetch(const FetchRequest& f) {
  net::WireWriter w;
  w.U64(f.head_id);
  w.U32(f.deadline_ms);
  w.U64(f.block_bytes);
  w.U32(f.slices);
  w.U32(f.found_blocks);
  w.U32(static_cast<uint32_t>(f.runs.size()));
  for (const store::Run& r : f.runs) {
    w.U64(r.owner);
    w.U64(r.tensor);
    w.U32(r.first);
    w.U32(r.count);
  }
  w.U32(f.first);
  w.U32(static_cast<uint32_t>(f.ids.size()));
  for (int32_t id : f.ids) w.U32(static_cast<uint32_t>(id));
  return w.Take();
}

namespace {
// Block ids, each below n_blocks.
bool ReadIds(net::WireReader& rd, uint32_t n_blocks, std::vector<int32_t>& ids) {
  const uint32_t n = rd.Count(kMaxFetchBlocks, 4);
  if (!rd.ok()) return false;
  ids.resize(n);
  for (int32_t& id : ids) {
    const uint32_t v = rd.U32();
    if (v >= n_blocks) return false;
    id = static_cast<int32_t>(v);
  }
  return rd.ok();
}
}  // namespace

Status DecodeFetch(std::string_view body, uint32_t n_blocks, FetchRequest& f) {
  net::WireReader rd(body);
  f.head_id = rd.U64();
  f.deadline_ms = rd.U32();
  f.block_bytes = rd.U64();
  f.slices = rd.U32();
  f.found_blocks = rd.U32();
  const uint32_t nr = rd.Count(kMaxFetchBlocks, 24);
  f.runs.resize(rd.ok() ? nr : 0);
  uint64_t sum = 0;
  for (store::Run& r : f.runs) {
    r.owner = rd.U64();
    r.tensor = rd.U64();
    r.first = rd.U32();
    r.count = rd.U32();
    sum += r.count;
  }
  f.first = rd.U32();
  if (!rd.ok() || !ReadIds(rd, n_blocks, f.ids) || !rd.Done()) return Corrupt("malformed or out-of-range grid fetch");
  if (f.found_blocks > kMaxFetchBlocks || sum != f.found_blocks || f.ids.empty() ||
      uint64_t{f.first} + f.ids.size() > f.found_blocks) {
    return InvalidArgument("grid fetch: blocks outside the prefix found");
  }
  if (f.deadline_ms == 0 || f.deadline_ms > 600000 || f.block_bytes == 0 || f.slices == 0 || f.block_bytes % f.slices != 0) {
    return InvalidArgument("grid fetch: deadline or block geometry out of range");
  }
  return Status::Ok();
}

std::string EncodeFetchReply(const FetchReply& r) {
  net::WireWriter w;
  w.U8(static_cast<uint8_t>(r.status.code()));
  w.Str(r.status.message());
  for (uint32_t v : {r.memory, r.replica, r.ssd, r.remote}) w.U32(v);
  return w.Take();
}

Status DecodeFetchReply(std::string_view body, FetchReply& r) {
  net::WireReader rd(body);
  const uint8_t code = rd.U8();
  const std::string msg(rd.Str(1 << 16));
  for (uint32_t* v : {&r.memory, &r.replica, &r.ssd, &r.remote}) *v = rd.U32();
  if (!rd.Done() || code > static_cast<uint8_t>(kLastStatusCode)) return Corrupt("malformed grid fetch reply");
  r.status = code == 0 ? Status::Ok() : Status(static_cast<StatusCode>(code), msg);
  return Status::Ok();
}

std::string EncodeRead(const ReadRequest& r) {
  net::WireWriter w;
  w.U64(r.head_id);
  w.U32(static_cast<uint32_t>(r.ids.size()));
  for (int32_t id : r.ids) w.U32(static_cast<uint32_t>(id));
  return w.Take();
}

Status DecodeRead(std::string_view body, uint32_t n_blocks, ReadRequest& r) {
  net::WireReader rd(body);
  r.head_id = rd.U64();
  if (!rd.ok() || !ReadIds(rd, n_blocks, r.ids) || !rd.Done()) return Corrupt("malformed or out-of-range grid read");
  return Status::Ok();
}

std::string EncodeStepHeader(uint64_t head_id, uint64_t seq) {
  net::WireWriter w;
  w.U64(head_id);
  w.U64(seq);
  return w.Take();
}

std::string EncodeStepPrefix(std::span<const std::array<int32_t, 3>> copies, std::span<const StepSeq> seqs) {
  net::WireWriter w;
  w.U32(static_cast<uint32_t>(copies.size()));
  for (const auto& c : copies) {
    for (int32_t v : c) w.U32(static_cast<uint32_t>(v));
  }
  w.U32(static_cast<uint32_t>(seqs.size()));
  uint32_t rows = 0;
  for (const StepSeq& s : seqs) {
    w.U32(static_cast<uint32_t>(s.pos0));
    w.U32(static_cast<uint32_t>(s.n_tokens));
    w.U32(static_cast<uint32_t>(s.table.size()));
    for (int32_t b : s.table) w.U32(static_cast<uint32_t>(b));
    rows += static_cast<uint32_t>(s.n_tokens);
  }
  w.U32(rows);
  return w.Take();
}

Status DecodeStep(std::string_view body, const HelloRequest& g, uint32_t n_embd, StepRequest& out) {
  net::WireReader rd(body);
  out.head_id = rd.U64();
  out.seq = rd.U64();
  const uint32_t n_copies = rd.Count(kMaxCopies, 12);
  out.copies.resize(n_copies);
  for (auto& c : out.copies) {
    for (int32_t& v : c) v = static_cast<int32_t>(rd.U32());
    if (!rd.ok()) break;
    if (c[0] < 0 || c[1] < 0 || static_cast<uint32_t>(c[0]) >= g.n_blocks || static_cast<uint32_t>(c[1]) >= g.n_blocks ||
        c[0] == c[1] || c[2] < 0 || static_cast<uint32_t>(c[2]) > g.block_size) {
      return InvalidArgument(fmt::format("grid step: block copy ({}, {}, {}) outside the pool of {} blocks of {}", c[0],
                                         c[1], c[2], g.n_blocks, g.block_size));
    }
  }
  const uint32_t n_seqs = rd.Count(std::min(kMaxSeqs, g.max_seqs), 12);
  out.seqs.resize(n_seqs);
  uint64_t rows = 0;
  for (StepSeq& s : out.seqs) {
    s.pos0 = static_cast<int32_t>(rd.U32());
    s.n_tokens = static_cast<int32_t>(rd.U32());
    const uint32_t n_table = rd.Count(kMaxTableBlocks, 4);
    if (!rd.ok()) break;
    s.table.resize(n_table);
    for (int32_t& b : s.table) {
      b = static_cast<int32_t>(rd.U32());
      if (b < 0 || static_cast<uint32_t>(b) >= g.n_blocks) {
        return InvalidArgument(fmt::format("grid step: block id {} outside the pool of {} blocks", b, g.n_blocks));
      }
    }
    const int64_t end = static_cast<int64_t>(s.pos0) + s.n_tokens;
    if (s.pos0 < 0 || s.n_tokens < 1 || end > static_cast<int64_t>(g.n_ctx) ||
        static_cast<int64_t>(n_table) * g.block_size < end) {
      return InvalidArgument(fmt::format("grid step: sequence at {}+{} (table of {} blocks, context {})", s.pos0,
                                         s.n_tokens, n_table, g.n_ctx));
    }
    rows += static_cast<uint64_t>(s.n_tokens);
    if (rows > g.max_batch_tokens) return InvalidArgument(fmt::format("grid step: more than {} tokens", g.max_batch_tokens));
  }
  out.n_rows = rd.U32();
  if (!rd.ok()) return Corrupt("malformed grid step");
  if (out.n_rows != rows) return InvalidArgument(fmt::format("grid step: {} rows for sequences of {} tokens", out.n_rows, rows));
  const uint64_t want = rows * n_embd * sizeof(float);
  if (rd.remaining() != want) {
    return InvalidArgument(fmt::format("grid step: hidden state of {} bytes, {} expected", rd.remaining(), want));
  }
  out.hidden = body.substr(body.size() - static_cast<size_t>(want));
  return Status::Ok();
}

}  // namespace trellis::grid
