// The grid's messages (docs/grid.md, "Protocol"): net::Transport requests from the head
// to a node, WireWriter-encoded. Every reply may instead be an error
// (Transport::ReplyError). A node checks every field of a Step against the geometry it
// agreed to at Hello before anything touches its pool.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "store/client.h"
#include "util/status.h"

namespace trellis::grid {

enum MsgType : uint16_t {
  // HelloRequest -> HelloReply. Resets the node: its pool's contents are forgotten and
  // the next Step it takes is number 1.
  kHello = 0x101,
  // StepRequest -> the hidden state after the node's last layer, rows x n_embd f32.
  kStep = 0x102,
  // any body (at most 1 MiB) -> the same body, answered on the node's loop thread: the
  // head measures the link with it.
  kPing = 0x103,
  // FetchRequest -> FetchReply: the node reads its layers' byte range of stored blocks
  // from the prefix store straight into its pool (docs/grid.md, "The store").
  kFetch = 0x104,
  // ReadRequest -> the node's layers of each block named, back to back: what a head
  // publishes to the store is gathered whole this way.
  kRead = 0x105,
};

inline constexpr uint32_t kProtocolVersion = 3;  // 2: Fetch and Read (the store); 3: K/V types in Hello
inline constexpr uint32_t kMaxSeqs = 4096;           // sequences in one step
inline constexpr uint32_t kMaxCopies = 1 << 16;      // block copies carried by one step
inline constexpr uint32_t kMaxTableBlocks = 1 << 20;  // one sequence's block table
inline constexpr uint32_t kMaxBatchTokens = 1 << 16;

struct HelloRequest {
  uint32_t version = kProtocolVersion;
  uint64_t head_id = 0;      // this head's incarnation: steps from another are refused
  uint64_t fingerprint = 0;  // the model's (Model::fingerprint)
  uint32_t n_layer = 0;      // the model's layers
  uint32_t first_layer = 0, last_layer = 0;  // what this node is expected to hold [first, last)
  uint32_t block_size = 0;
  uint32_t n_blocks = 0;     // the head's pool: ids are [0, n_blocks)
  uint32_t max_batch_tokens = 0;
  uint32_t max_seqs = 0;
  uint32_t n_ctx = 0;        // positions per sequence
  uint32_t store = 0;        // 1: the head reads prefixes from a store, so must the node
  uint32_t kv_types = 0;     // KvLayout::TypeCode() of the pool: the node's must be the same
};

struct HelloReply {
  uint64_t fingerprint = 0;
  uint32_t first_layer = 0, last_layer = 0;
  uint32_t threads = 0;
  uint64_t weight_bytes = 0;   // this node's share of the weights
  uint64_t kv_pool_bytes = 0;  // its pool: its layers' slice of n_blocks blocks
};

// One sequence of a step: positions [pos0, pos0 + n_tokens), block table covering them.
struct StepSeq {
  int32_t pos0 = 0;
  int32_t n_tokens = 0;
  std::vector<int32_t> table;
};

// A step's body: head_id u64, seq u64, then the prefix (the same for every node of a
// step), then that node's input hidden state.
struct StepRequest {
  uint64_t head_id = 0;
  uint64_t seq = 0;  // 1, 2, ... per node after its Hello; a node runs steps in this order
  std::vector<std::array<int32_t, 3>> copies;  // (src, dst, n_slots): applied first, in order
  std::vector<StepSeq> seqs;
  uint32_t n_rows = 0;          // sum of n_tokens
  std::string_view hidden;      // n_rows x n_embd f32, little-endian (a view into the message)
};

// Fetch: blocks [first, first + ids.size()) of a stored prefix (the head's lookup:
// `found_blocks` blocks as `runs`) into the node's pool blocks `ids`, its layers' range of
// each, within deadline_ms.
struct FetchRequest {
  uint64_t head_id = 0;
  uint32_t deadline_ms = 0;
  uint64_t block_bytes = 0;  // a whole block, every layer
  uint32_t slices = 0;       // the block's layers
  uint32_t found_blocks = 0;
  std::vector<store::Run> runs;
  uint32_t first = 0;
  std::vector<int32_t> ids;
};
// The node's answer to a Fetch it ran (a transport error means it may still be running):
// the store's status, and where the blocks came from.
struct FetchReply {
  Status status;
  uint32_t memory = 0, replica = 0, ssd = 0, remote = 0;
};
struct ReadRequest {
  uint64_t head_id = 0;
  std::vector<int32_t> ids;
};
inline constexpr uint32_t kMaxFetchBlocks = 1 << 16;

std::string EncodeFetch(const FetchRequest& f);
// Checks the block ids against n_blocks and the runs against found_blocks.
Status DecodeFetch(std::string_view body, uint32_t n_blocks, FetchRequest& f);
std::string EncodeFetchReply(const FetchReply& r);
Status DecodeFetchReply(std::string_view body, FetchReply& r);
std::string EncodeRead(const ReadRequest& r);
Status DecodeRead(std::string_view body, uint32_t n_blocks, ReadRequest& r);

std::string EncodeHello(const HelloRequest& h);
Status DecodeHello(std::string_view body, HelloRequest& h);
std::string EncodeHelloReply(const HelloReply& r);
Status DecodeHelloReply(std::string_view body, HelloReply& r);

// The step's fields after head_id and seq, before the hidden state: the same for every
// node of a step.
std::string EncodeStepPrefix(std::span<const std::array<int32_t, 3>> copies, std::span<const StepSeq> seqs);
// head_id and seq, the first 16 bytes of a step.
std::string EncodeStepHeader(uint64_t head_id, uint64_t seq);
// Checks the step against the geometry the node agreed to: block ids within n_blocks,
// tables covering every position, positions within n_ctx, batch size, copies' slots,
// and the hidden state's size (rows x n_embd x 4 bytes, exactly what remains).
Status DecodeStep(std::string_view body, const HelloRequest& geometry, uint32_t n_embd, StepRequest& out);

}  // namespace trellis::grid
