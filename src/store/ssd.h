// SsdTier: a store server's second tier, one file per tensor in --ssd-dir, plus the
// server's index as an append-only log, so a restarted server serves what it had.
//
// Tensor file DIR/<id as 16 hex digits>.tns:
//   header: magic "TRLSTNS1" u64, version u32 (2), tensor id u64, blocks u32, block bytes
//           u64, slices u32, cost s f64, reads u64, blocks x slices checksums u64 (each
//           block's slices in order), then XXH3-64 of all of that;
//   zeros up to the next multiple of 4096 bytes; then the blocks, back to back.
// Index log DIR/index.log: fixed 45-byte records, each ending with XXH3-64 of its first
// 37 bytes: kind u8 ('A' an index entry, 'F' forget a tensor), key 16 B, owner u64,
// tensor u64, block index u32. Replay reads every whole record: a bad one (a flipped
// byte, a torn write) is skipped and counted, never the ones after it; a partial record at
// the end (an append cut short) is cut off. The server drops entries of its own tensors
// that did not survive (they were only in memory when it died). The log is rewritten with
// the live entries alone (to index.log.tmp, synced, renamed over) once it holds more than
// twice as many records as live entries plus 4096.
//
// Everything read back is checked: header checksum, sizes against the file, every block
// against its checksum (at start for the whole dir, and again on each read). A file that
// fails is deleted and counted, never served.
//
// Not thread-safe: the server's loop thread owns it. Reads and writes are synchronous
// pread/pwrite (page cache; no fsync per tensor: a crashed process loses nothing, a lost
// machine may lose the last writes, which are then misses).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "store/keys.h"
#include "util/status.h"
#include "util/env.h"

namespace trellis::store {

struct SsdTensor {
  uint64_t id = 0;
  uint32_t n_blocks = 0;
  uint64_t block_bytes = 0;
  uint32_t slices = 1;  // checksummed parts of each block
  double cost_s = 0;
  uint64_t reads = 0;
  std::vector<uint64_t> checksums;
  uint64_t bytes() const { return static_cast<uint64_t>(n_blocks) * block_bytes; }
};

struct IndexRecord {
  Key key;
  uint64_t owner = 0, tensor = 0;
  uint32_t index = 0;
};

class SsdTier {
 public:
  // Opens (creating) dir; checks and lists every tensor file, deleting bad ones; replays
  // the index log. capacity: bytes of tensor data the tier may hold; compact_slack: the
  // dead records the log may hold beyond twice the live ones before it is rewritten.
  // env: the file system (util/env.h; tests pass a FaultEnv), kept for the tier's life.
  static Result<std::unique_ptr<SsdTier>> Open(const std::string& dir, uint64_t capacity, size_t compact_slack = 4096,
                                               Env* env = Env::Default());
  ~SsdTier() = default;

  // What Open found intact (tensor id -> metadata), and the index entries live now
  // (added and not forgotten; at start, what the log held).
  const std::map<uint64_t, SsdTensor>& restored() const { return restored_; }
  std::vector<IndexRecord> LiveIndex() const;
  uint64_t files_rejected() const { return rejected_; }
  uint64_t temp_files_removed() const { return temp_removed_; }
  uint64_t log_records_skipped() const { return records_skipped_; }
  uint64_t log_records() const { return log_records_; }
  uint64_t log_compactions() const { return compactions_; }
  uint64_t log_write_failures() const { return log_write_failures_; }
  // Tensor writes and reads the file system refused (ENOSPC, EIO, ...): each one a
  // refusal the caller sees as an IoError, the tier's state unchanged.
  uint64_t write_failures() const { return write_failures_; }
  uint64_t read_failures() const { return read_failures_; }

  uint64_t used() const { return used_; }
  uint64_t capacity() const { return capacity_; }
  bool Has(uint64_t id) const { return sizes_.count(id) != 0; }

  Status Write(const SsdTensor& meta, const uint8_t* data);
  // Reads blocks of a tensor into dst, checking each against meta's checksums (Corrupt
  // on a mismatch: the file is deleted).
  Status Read(const SsdTensor& meta, uint8_t* dst);
  void Remove(uint64_t id);

  void LogAdd(const IndexRecord& r);
  void LogForget(uint64_t owner, uint64_t tensor);
  // Forgets (owner, tensor)'s entries if the log holds any.
  void DropEntries(uint64_t owner, uint64_t tensor);

 private:
  SsdTier() = default;
  std::string PathOf(uint64_t id) const;
  Status Scan();
  void Replay();
  void Append(uint8_t kind, const IndexRecord& r);
  void MaybeCompact();
  static std::string Encode(uint8_t kind, const IndexRecord& r);

  std::string dir_;
  uint64_t capacity_ = 0, used_ = 0, rejected_ = 0;
  std::map<uint64_t, uint64_t> sizes_;  // tensor id -> file data bytes
  std::map<uint64_t, SsdTensor> restored_;
  // The log's live entries by (owner, tensor), as replayed and appended since.
  std::map<std::pair<uint64_t, uint64_t>, std::vector<IndexRecord>> live_;
  Env* env_ = nullptr;
  std::unique_ptr<File> log_;
  uint64_t log_bytes_ = 0, log_records_ = 0, records_skipped_ = 0, temp_removed_ = 0, compactions_ = 0,
           log_write_failures_ = 0, write_failures_ = 0, read_failures_ = 0;
  size_t compact_slack_ = 4096;
};

}  // namespace trellis::store
