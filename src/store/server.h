// StoreServer: one node's share of the prefix tensor store (docs/store.md).
//
// It holds, in one registered memory arena, the tensors it owns: each a run of whole KV
// blocks stored contiguously, with a checksum per block. It also keeps the index for the
// chain keys placed on it: key -> (owner, tensor, block index inside the tensor), which is
// what Lookup walks. Everything lives on the transport's loop thread.
//
// Memory: tensors are placed first-fit in the arena; when a new tensor does not fit,
// tensors are evicted in GDSF order (priority = clock + reads x cost / bytes, the clock
// raised to each evicted priority) until a hole is large enough. A leased tensor (being
// read) is never evicted or moved; a lease expires after its time, so a dead reader pins
// nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net/transport.h"
#include "util/env.h"
#include "util/status.h"

namespace trellis::store {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;         // 0: any
  uint64_t mem_bytes = 64ull << 20;
  uint32_t max_lease_ms = 10000;
  // Replicas: this node copies a tensor owned by a peer once local readers have asked
  // it for that tensor replica_after_reads times, within replica_share of --mem.
  // (trellis bench store measured 1 against 2: copying at the first read doubled the
  // bytes moved during that read and slowed it more than later replica hits saved.)
  double replica_share = 0.25;
  uint32_t replica_after_reads = 2;
  std::vector<std::string> peers;  // "host:port" of the other store servers
  // etcd ("http://HOST:PORT"), or "": the server registers `advertise` under a lease of
  // etcd_ttl_s seconds (renewed every third of it) and takes its peers from there too.
  std::string etcd;
  int etcd_ttl_s = 5;
  std::string advertise;  // the address others reach it at; default host:port
  std::string ssd_dir;      // "": no SSD tier
  uint64_t ssd_bytes = 0;   // tensor bytes the SSD tier may hold
  Env* ssd_env = nullptr;   // the SSD tier's file system (util/env.h); nullptr: Env::Default()
  net::TransportOptions transport;
};

struct ServerStats {
  uint64_t tensors = 0, bytes_used = 0, bytes_capacity = 0, index_keys = 0;
  uint64_t puts = 0, put_bytes = 0, put_failures = 0, commits = 0;
  uint64_t put_checksum_failures = 0;  // puts refused: landed bytes unlike the writer's checksums
  uint64_t lookups = 0, lookup_blocks_matched = 0;
  uint64_t claims = 0, claim_waits = 0;  // keys claimed (single-flight); lookups told to wait
  uint64_t acquires = 0, acquire_hits = 0, acquire_misses = 0;
  uint64_t evictions = 0, evicted_bytes = 0, full_refusals = 0;
  uint64_t leases_active = 0, lease_expiries = 0;
  uint64_t claims_active = 0;  // claimed keys whose claim has not expired
  uint64_t forgotten = 0, refused_requests = 0, peers = 0;
  uint64_t replicas = 0, replica_bytes = 0, replica_hits = 0, replicas_made = 0, replicas_dropped = 0,
           replication_failures = 0;
  uint64_t ssd_tensors = 0, ssd_bytes_used = 0, ssd_bytes_capacity = 0;
  uint64_t ssd_flushes = 0, ssd_reads = 0, ssd_evictions = 0, ssd_checksum_failures = 0, ssd_restored = 0,
           ssd_rejected = 0;
  // The SSD tier's recovery at start (entries of tensors that did not survive, bad log
  // records, leftover temp files) and its log's compactions.
  uint64_t ssd_entries_dropped = 0, ssd_log_records_skipped = 0, ssd_temp_files_removed = 0, ssd_log_compactions = 0;
  // What the file system refused (ENOSPC, EIO): tensor writes (the tensor then leaves
  // memory as if there were no SSD tier), tensor reads (a miss), index log writes.
  uint64_t ssd_write_failures = 0, ssd_read_failures = 0, ssd_log_write_failures = 0;
};

class StoreServer {
 public:
  static Result<std::unique_ptr<StoreServer>> Start(const ServerOptions& options);
  ~StoreServer();

  uint16_t port() const;
  uint64_t node_id() const;  // XXH3-64 of "host:port", as clients name owners
  ServerStats stats() const;
  std::string MetricsText() const;
  // Flips one byte of a stored tensor behind its checksum's back, as a bad DIMM or a
  // corrupted transfer would (tests only). False if there is no such byte.
  bool CorruptByteForTesting(uint64_t tensor, uint64_t byte);
  std::vector<uint64_t> TensorIdsForTesting() const;
  // Flips one byte of the next `count` segments this server's transport lands (a put's or
  // a replica's bytes changed on the wire, after the transport's own checks; tests only).
  void CorruptLandingsForTesting(int count);

  struct Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The node id of the server listening at "host:port".
uint64_t NodeId(const std::string& address);

}  // namespace trellis::store
