#include "store/ssd.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <xxhash.h>

#include "net/wire.h"
#include "store/protocol.h"
#include "util/checksum.h"
#include "util/log.h"

namespace trellis::store {

namespace {

constexpr uint64_t kMagic = 0x31534e54534c5254ull;  // "TRLSTNS1"
constexpr uint32_t kVersion = 2;
constexpr uint64_t kPage = 4096;
constexpr size_t kFixedHeader = 8 + 4 + 8 + 4 + 8 + 4 + 8 + 8;

size_t HeaderBytes(uint64_t n_checksums) { return kFixedHeader + 8 * static_cast<size_t>(n_checksums); }
// Where the blocks start: after the header and its checksum, on a page boundary.
uint64_t DataOffset(const SsdTensor& m) {
  return (HeaderBytes(m.checksums.size()) + 8 + kPage - 1) / kPage * kPage;
}
constexpr size_t kRecordBytes = 45;
constexpr uint64_t kMaxBlockBytes = 1ull << 32;

std::string Header(const SsdTensor& m) {
  net::WireWriter w;
  w.U64(kMagic);
  w.U32(kVersion);
  w.U64(m.id);
  w.U32(m.n_blocks);
  w.U64(m.block_bytes);
  w.U32(m.slices);
  w.F64(m.cost_s);
  w.U64(m.reads);
  for (uint64_t c : m.checksums) w.U64(c);
  std::string h = w.Take();
  net::WireWriter t;
  t.U64(XXH3_64bits(h.data(), h.size()));
  return h + t.Take();
}

// The header's length, from its first kPage bytes (0: not a header this version reads).
size_t PeekHeaderBytes(std::string_view b) {
  net::WireReader r(b);
  if (r.U64() != kMagic || r.U32() != kVersion) return 0;
  r.U64();
  const uint64_t n_blocks = r.U32();
  r.U64();
  const uint64_t slices = r.U32();
  if (!r.ok() || n_blocks > kMaxKeys || slices > kMaxSlices || n_blocks * slices > kMaxChecksums) return 0;
  return HeaderBytes(n_blocks * slices);
}

// Parses and checks a header (at least its length and checksum) read from the start of a
// file of `file_size` bytes.
Result<SsdTensor> ParseHeader(std::string_view b, uint64_t file_size) {
  net::WireReader r(b);
  SsdTensor m;
  if (r.U64() != kMagic || r.U32() != kVersion) return Corrupt("not a tensor file");
  m.id = r.U64();
  m.n_blocks = r.U32();
  m.block_bytes = r.U64();
  m.slices = r.U32();
  m.cost_s = r.F64();
  m.reads = r.U64();
  if (m.n_blocks == 0 || m.n_blocks > kMaxKeys || m.block_bytes == 0 || m.block_bytes > kMaxBlockBytes ||
      !ValidSlices(m.block_bytes, m.slices) || uint64_t{m.n_blocks} * m.slices > kMaxChecksums) {
    return Corrupt("tensor file header out of range");
  }
  const size_t header = HeaderBytes(uint64_t{m.n_blocks} * m.slices);
  if (header + 8 > b.size()) return Corrupt("tensor file header out of range");
  m.checksums.resize(size_t{m.n_blocks} * m.slices);
  for (uint64_t& c : m.checksums) c = r.U64();
  const uint64_t sum = r.U64();
  if (!r.ok() || sum != XXH3_64bits(b.data(), header)) return Corrupt("tensor file header checksum mismatch");
  if (file_size != DataOffset(m) + m.bytes()) return Corrupt("tensor file is truncated or too long");
  if (!(m.cost_s >= 0 && m.cost_s < 1e9)) return Corrupt("tensor file cost out of range");
  return m;
}

}  // namespace

std::string SsdTier::PathOf(uint64_t id) const { return fmt::format("{}/{:016x}.tns", dir_, id); }

Result<std::unique_ptr<SsdTier>> SsdTier::Open(const std::string& dir, uint64_t capacity, size_t compact_slack,
                                               Env* env) {
  if (Status s = env->CreateDir(dir); !s.ok()) return IoError("cannot create --ssd-dir: " + s.message());
  std::unique_ptr<SsdTier> t(new SsdTier());
  t->env_ = env;
  t->dir_ = dir;
  t->capacity_ = capacity;
  t->compact_slack_ = compact_slack;
  TRELLIS_RETURN_IF_ERROR(t->Scan());
  t->Replay();
  t->MaybeCompact();
  return t;
}

Status SsdTier::Scan() {
  auto listed = env_->ListDir(dir_);
  if (!listed.ok()) return IoError("cannot read --ssd-dir: " + listed.status().message());
  std::vector<std::string> names;
  for (const std::string& n : *listed) {
    if (n.size() == 20 && n.substr(16) == ".tns") names.push_back(n);
    if (n.size() == 24 && n.substr(16) == ".tns.tmp") {  // a write cut short
      (void)env_->Remove(dir_ + "/" + n);
      ++temp_removed_;
    }
    if (n == "index.log.tmp") (void)env_->Remove(dir_ + "/" + n);  // a compaction cut short
  }
  std::sort(names.begin(), names.end());
  std::vector<uint8_t> buf;
  for (const std::string& n : names) {
    const std::string path = dir_ + "/" + n;
    auto reject = [&](const std::string& why) {
      TRELLIS_LOG_WARN("store: {}: {}; deleted", path, why);
      (void)env_->Remove(path);
      ++rejected_;
    };
    auto file = env_->Open(path, OpenMode::kRead);
    auto file_size = file.ok() ? (*file)->Size() : Result<uint64_t>(file.status());
    if (!file_size.ok()) {
      reject("unreadable");
      continue;
    }
    File& f = **file;
    const uint64_t size = *file_size;
    std::string head(kPage, '\0');
    if (size < kPage || !f.ReadAt(0, head.data(), head.size()).ok()) {
      reject("shorter than a header");
      continue;
    }
    const size_t header = PeekHeaderBytes(head);
    if (header == 0) {
      reject("not a tensor file of this version");
      continue;
    }
    if (header + 8 > head.size()) {
      // A long header (many blocks or slices): read all of it.
      head.resize((header + 8 + kPage - 1) / kPage * kPage);
      if (size < head.size() || !f.ReadAt(0, head.data(), head.size()).ok()) {
        reject("shorter than its header");
        continue;
      }
    }
    auto m = ParseHeader(head, size);
    if (!m.ok()) {
      reject(m.status().message());
      continue;
    }
    if (fmt::format("{:016x}.tns", m->id) != n) {
      reject("named for another tensor");
      continue;
    }
    buf.resize(m->block_bytes);
    std::vector<uint64_t> sums(m->slices);
    bool good = true;
    for (uint32_t b = 0; b < m->n_blocks && good; ++b) {
      good = f.ReadAt(DataOffset(*m) + b * m->block_bytes, buf.data(), buf.size()).ok();
      if (good) SliceChecksums(buf.data(), m->block_bytes, m->slices, sums.data());
      good = good && std::equal(sums.begin(), sums.end(), m->checksums.begin() + static_cast<ptrdiff_t>(size_t{b} * m->slices));
    }
    if (!good || used_ + m->bytes() > capacity_) {
      reject(good ? "over the tier's capacity" : "a block fails its checksum");
      continue;
    }
    used_ += m->bytes();
    sizes_[m->id] = m->bytes();
    restored_[m->id] = std::move(m).value();
  }
  return Status::Ok();
}

void SsdTier::Replay() {
  const std::string path = dir_ + "/index.log";
  auto log = env_->Open(path, OpenMode::kReadWrite);
  auto log_size = log.ok() ? (*log)->Size() : Result<uint64_t>(log.status());
  if (!log_size.ok()) {
    TRELLIS_LOG_WARN("store: {}; the index will not survive a restart", log_size.status().message());
    return;
  }
  log_ = std::move(log).value();
  const uint64_t size = *log_size;
  // Every whole record is read: a bad one (a flipped byte, a write torn inside the file)
  // is skipped and counted, and the records after it still count. Records are fixed-size,
  // so a bad one never hides where the next begins.
  uint8_t rec[kRecordBytes];
  uint64_t off = 0;
  for (; off + kRecordBytes <= size; off += kRecordBytes) {
    if (!log_->ReadAt(off, rec, kRecordBytes).ok()) break;
    net::WireReader r(std::string_view(reinterpret_cast<char*>(rec), kRecordBytes));
    const uint8_t kind = r.U8();
    IndexRecord x;
    x.key.lo = r.U64();
    x.key.hi = r.U64();
    x.owner = r.U64();
    x.tensor = r.U64();
    x.index = r.U32();
    const uint64_t sum = r.U64();
    ++log_records_;
    if (sum != XXH3_64bits(rec, kRecordBytes - 8) || (kind != 'A' && kind != 'F')) {
      ++records_skipped_;
      continue;
    }
    if (kind == 'A') {
      live_[{x.owner, x.tensor}].push_back(x);
    } else {
      live_.erase({x.owner, x.tensor});
    }
  }
  if (records_skipped_ > 0) TRELLIS_LOG_WARN("store: {}: {} bad records skipped", path, records_skipped_);
  if (off != size) {
    // Only a partial record: the tail of an append the crash cut short.
    TRELLIS_LOG_WARN("store: {}: a torn record of {} bytes at the end dropped", path, size - off);
    if (!log_->Truncate(off).ok()) TRELLIS_LOG_WARN("store: cannot truncate {}", path);
  }
  log_bytes_ = off;
}

void SsdTier::DropEntries(uint64_t owner, uint64_t tensor) {
  if (live_.count({owner, tensor})) LogForget(owner, tensor);
}

std::vector<IndexRecord> SsdTier::LiveIndex() const {
  std::vector<IndexRecord> out;
  for (const auto& [ot, recs] : live_) out.insert(out.end(), recs.begin(), recs.end());
  return out;
}

std::string SsdTier::Encode(uint8_t kind, const IndexRecord& r) {
  net::WireWriter w;
  w.U8(kind);
  w.U64(r.key.lo);
  w.U64(r.key.hi);
  w.U64(r.owner);
  w.U64(r.tensor);
  w.U32(r.index);
  std::string b = w.Take();
  net::WireWriter t;
  t.U64(XXH3_64bits(b.data(), b.size()));
  return b + t.Take();
}

void SsdTier::Append(uint8_t kind, const IndexRecord& r) {
  if (kind == 'A') {
    live_[{r.owner, r.tensor}].push_back(r);
  } else {
    live_.erase({r.owner, r.tensor});
  }
  if (!log_) return;
  const std::string b = Encode(kind, r);
  if (Status w = log_->WriteAt(log_bytes_, b.data(), b.size()); !w.ok()) {
    // Part of the record may be on disk: the next append overwrites it (log_bytes_ did
    // not move), and replay skips it (its checksum) or cuts it (a torn tail).
    TRELLIS_LOG_WARN("store: index log: {}", w.message());
    ++log_write_failures_;
    return;
  }
  log_bytes_ += b.size();
  ++log_records_;
  MaybeCompact();
}

void SsdTier::MaybeCompact() {
  if (!log_) return;
  size_t live = 0;
  for (const auto& [ot, recs] : live_) live += recs.size();
  if (log_records_ <= 2 * live + compact_slack_) return;
  // The live entries alone, to a new file that replaces the log only once it is whole
  // and synced: a crash before the rename leaves the old log, after it the new one.
  const std::string path = dir_ + "/index.log", tmp = path + ".tmp";
  std::string body;
  body.reserve(live * kRecordBytes);
  for (const auto& [ot, recs] : live_) {
    for (const IndexRecord& x : recs) body += Encode('A', x);
  }
  Status s;
  {
    auto f = env_->Open(tmp, OpenMode::kTruncate);
    s = f.ok() ? (*f)->WriteAt(0, body.data(), body.size()) : f.status();
    if (s.ok()) s = (*f)->Sync();
  }
  if (s.ok()) s = env_->Rename(tmp, path);
  std::unique_ptr<File> reopened;
  if (s.ok()) {
    auto f = env_->Open(path, OpenMode::kReadWrite);
    if (f.ok()) reopened = std::move(f).value();
    s = f.status();
  }
  if (!s.ok()) {
    TRELLIS_LOG_WARN("store: compacting {} failed: {}; the log keeps growing", path, s.message());
    (void)env_->Remove(tmp);
    ++log_write_failures_;
    compact_slack_ *= 2;  // not again at every append
    return;
  }
  log_ = std::move(reopened);
  log_bytes_ = body.size();
  log_records_ = live;
  ++compactions_;
}

void SsdTier::LogAdd(const IndexRecord& r) { Append('A', r); }

void SsdTier::LogForget(uint64_t owner, uint64_t tensor) {
  IndexRecord r;
  r.owner = owner;
  r.tensor = tensor;
  Append('F', r);
}

Status SsdTier::Write(const SsdTensor& meta, const uint8_t* data) {
  if (used_ + meta.bytes() > capacity_) return ResourceExhausted("SSD tier full");
  const std::string path = PathOf(meta.id);
  const std::string tmp = path + ".tmp";
  // Complete files only: a crash mid-write leaves a .tmp, which Scan removes. Not
  // synced: a power cut may lose or tear a tensor written just before it, which Scan
  // then rejects by its checksums (a miss, never data); a sync per eviction would stall
  // the server's loop on the disk.
  std::string head = Header(meta);
  head.resize(DataOffset(meta), '\0');
  Status s;
  {
    auto f = env_->Open(tmp, OpenMode::kTruncate);
    s = f.ok() ? (*f)->WriteAt(0, head.data(), head.size()) : f.status();
    if (s.ok()) s = (*f)->WriteAt(DataOffset(meta), data, meta.bytes());
  }
  if (s.ok()) s = env_->Rename(tmp, path);
  if (!s.ok()) {
    (void)env_->Remove(tmp);
    ++write_failures_;
    return IoError("SSD tier: " + s.message());
  }
  used_ += meta.bytes();
  sizes_[meta.id] = meta.bytes();
  return Status::Ok();
}

Status SsdTier::Read(const SsdTensor& meta, uint8_t* dst) {
  const std::string path = PathOf(meta.id);
  auto f = env_->Open(path, OpenMode::kRead);
  if (!f.ok() && f.status().code() == StatusCode::kNotFound) return NotFound("tensor file " + path + " is gone");
  Status s = f.ok() ? (*f)->ReadAt(DataOffset(meta), dst, meta.bytes()) : f.status();
  if (!s.ok()) {
    ++read_failures_;
    return IoError("SSD tier: " + s.message());
  }
  std::vector<uint64_t> sums(meta.slices);
  for (uint32_t b = 0; b < meta.n_blocks; ++b) {
    SliceChecksums(dst + b * meta.block_bytes, meta.block_bytes, meta.slices, sums.data());
    if (!std::equal(sums.begin(), sums.end(), meta.checksums.begin() + static_cast<ptrdiff_t>(size_t{b} * meta.slices))) {
      Remove(meta.id);
      return Corrupt(fmt::format("{}: block {} fails its checksum; deleted", path, b));
    }
  }
  return Status::Ok();
}

void SsdTier::Remove(uint64_t id) {
  auto it = sizes_.find(id);
  if (it == sizes_.end()) return;
  used_ -= it->second;
  sizes_.erase(it);
  (void)env_->Remove(PathOf(id));
}

}  // namespace trellis::store
