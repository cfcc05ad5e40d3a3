// trellis/store.h: a client of the prefix tensor store (docs/store.md) for your own
// program: store the blocks of a token sequence, find the longest stored prefix of
// another, read its blocks back.
//
//   auto store = trellis::StoreClient::Connect({.servers = {"127.0.0.1:7600"}});
//   trellis::BlockNamespace ns{.model_fingerprint = 42, .block_tokens = 16};
//   (*store)->Put(ns, tokens, blocks, block_bytes);            // only what is not stored yet
//   auto n = (*store)->Lookup(ns, other_tokens);                // whole blocks stored
//   (*store)->Get(ns, other_tokens, *n, buffers, block_bytes);  // checked against checksums
//
// A sequence is stored as blocks of block_tokens tokens (a trailing partial block is not
// stored); a block is any bytes the caller gives (an engine's are its KV cache). Every
// call has the client's deadline; a server that is down or slow makes the call fail
// (Unavailable, DeadlineExceeded), never hang. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trellis/status.h"

namespace trellis {

struct StoreConfig {
  std::vector<std::string> servers;  // "host:port" of store servers (the rest are learned from them)
  std::string local;                 // this node's own server (one of servers), read first; or ""
  std::string etcd;                  // "http://host:port": the members registered there, followed
  int timeout_ms = 2000;             // each call's deadline
};

// Everything that must match for stored blocks to be usable: blocks stored under one
// namespace are never found under another.
struct BlockNamespace {
  uint64_t model_fingerprint = 0;
  uint32_t block_tokens = 32;
  uint32_t kv_dtype = 0;
  uint32_t layout_version = 1;
  uint64_t salt = 0;
};

struct StoreReadReceipt {
  uint64_t local_memory = 0, local_replica = 0, local_ssd = 0, remote = 0;  // blocks, by source
};

class StoreClient {
 public:
  static Result<std::unique_ptr<StoreClient>> Connect(const StoreConfig& config);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // How many leading whole blocks of `tokens` are stored.
  Result<size_t> Lookup(const BlockNamespace& ns, std::span<const int32_t> tokens);
  // Reads the first n_blocks stored blocks of `tokens`, block i into dst[i] (block_bytes
  // each), each checked against the checksum its writer sent. NotFound if fewer are
  // stored; on any error nothing in dst is to be trusted.
  Status Get(const BlockNamespace& ns, std::span<const int32_t> tokens, size_t n_blocks, std::span<void* const> dst,
             uint64_t block_bytes, StoreReadReceipt* receipt = nullptr);
  // Stores the whole blocks of `tokens` (blocks[i] holds block i) past the longest prefix
  // already stored; returns how many were newly stored.
  Result<size_t> Put(const BlockNamespace& ns, std::span<const int32_t> tokens, std::span<const void* const> blocks,
                     uint64_t block_bytes);
  // The store's members, as this client sees them now.
  std::vector<std::string> Members() const;

  struct Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis
