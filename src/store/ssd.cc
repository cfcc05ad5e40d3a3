#include "store/ssd.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

bool PreadAll(int fd, void* buf, size_t n, uint64_t off) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

bool PwriteAll(int fd, const void* buf, size_t n, uint64_t off) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = pwrite(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

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

SsdTier::~SsdTier() {
  if (log_fd_ >= 0) close(log_fd_);
}

std::string SsdTier::PathOf(uint64_t id) const { return fmt::format("{}/{:016x}.tns", dir_, id); }

Result<std::unique_ptr<SsdTier>> SsdTier::Open(const std::string& dir, uint64_t capacity, size_t compact_slack) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return IoError("cannot create --ssd-dir " + dir + ": " + std::strerror(errno));
  }
  std::unique_ptr<SsdTier> t(new SsdTier());
  t->dir_ = dir;
  t->capacity_ = capacity;
  t->compact_slack_ = compact_slack;
  TRELLIS_RETURN_IF_ERROR(t->Scan());
  t->Replay();
  t->MaybeCompact();
  return t;
}

Status SsdTier::Scan() {
  DIR* d = opendir(dir_.c_str());
  if (!d) return IoError("cannot read --ssd-dir " + dir_ + ": " + std::strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() == 20 && n.substr(16) == ".tns") names.push_back(n);
    if (n.size() == 24 && n.substr(16) == ".tns.tmp") {  // a write cut short
      unlink((dir_ + "/" + n).c_str());
      ++temp_removed_;
    }
    if (n == "index.log.tmp") unlink((dir_ + "/" + n).c_str());  // a compaction cut short
  }
  closedir(d);
  std::vector<uint8_t> buf;
  for (const std::string& n : names) {
    const std::string path = dir_ + "/" + n;
    auto reject = [&](const std::string& why) {
      TRELLIS_LOG_WARN("store: {}: {}; deleted", path, why);
      unlink(path.c_str());
      ++rejected_;
    };
    Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st{};
    if (fd.fd < 0 || fstat(fd.fd, &st) != 0) {
      reject("unreadable");
      continue;
    }
    std::string head(kPage, '\0');
    if (static_cast<uint64_t>(st.st_size) < kPage || !PreadAll(fd.fd, head.data(), head.size(), 0)) {
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
      if (static_cast<uint64_t>(st.st_size) < head.size() || !PreadAll(fd.fd, head.data(), head.size(), 0)) {
        reject("shorter than its header");
        continue;
      }
    }
    auto m = ParseHeader(head, static_cast<uint64_t>(st.st_size));
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
      good = PreadAll(fd.fd, buf.data(), buf.size(), DataOffset(*m) + b * m->block_bytes);
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
  log_fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (log_fd_ < 0) {
    TRELLIS_LOG_WARN("store: cannot open {}: {}; the index will not survive a restart", path, std::strerror(errno));
    return;
  }
  struct stat st{};
  fstat(log_fd_, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // Every whole record is read: a bad one (a flipped byte, a write torn inside the file)
  // is skipped and counted, and the records after it still count. Records are fixed-size,
  // so a bad one never hides where the next begins.
  uint8_t rec[kRecordBytes];
  uint64_t off = 0;
  for (; off + kRecordBytes <= size; off += kRecordBytes) {
    if (!PreadAll(log_fd_, rec, kRecordBytes, off)) break;
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
    if (ftruncate(log_fd_, static_cast<off_t>(off)) != 0) TRELLIS_LOG_WARN("store: cannot truncate {}", path);
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
  if (log_fd_ < 0) return;
  const std::string b = Encode(kind, r);
  if (!PwriteAll(log_fd_, b.data(), b.size(), log_bytes_)) {
    TRELLIS_LOG_WARN("store: index log write failed: {}", std::strerror(errno));
    ++log_write_failures_;
    return;
  }
  log_bytes_ += b.size();
  ++log_records_;
  MaybeCompact();
}

void SsdTier::MaybeCompact() {
  if (log_fd_ < 0) return;
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
  bool ok;
  {
    Fd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ok = fd.fd >= 0 && PwriteAll(fd.fd, body.data(), body.size(), 0) && fsync(fd.fd) == 0;
  }
  const int nfd = ok && rename(tmp.c_str(), path.c_str()) == 0 ? open(path.c_str(), O_RDWR | O_CLOEXEC) : -1;
  if (nfd < 0) {
    TRELLIS_LOG_WARN("store: compacting {} failed: {}; the log keeps growing", path, std::strerror(errno));
    unlink(tmp.c_str());
    ++log_write_failures_;
    compact_slack_ *= 2;  // not again at every append
    return;
  }
  close(log_fd_);
  log_fd_ = nfd;
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
  Fd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.fd < 0) return IoError("cannot create " + tmp + ": " + std::strerror(errno));
  std::string head = Header(meta);
  head.resize(DataOffset(meta), '\0');
  if (!PwriteAll(fd.fd, head.data(), head.size(), 0) || !PwriteAll(fd.fd, data, meta.bytes(), DataOffset(meta))) {
    unlink(tmp.c_str());
    return IoError("writing " + tmp + ": " + std::strerror(errno));
  }
  // Complete files only: a crash mid-write leaves a .tmp, which Scan ignores.
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return IoError("renaming " + tmp + ": " + std::strerror(errno));
  }
  used_ += meta.bytes();
  sizes_[meta.id] = meta.bytes();
  return Status::Ok();
}

Status SsdTier::Read(const SsdTensor& meta, uint8_t* dst) {
  const std::string path = PathOf(meta.id);
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) return NotFound("tensor file " + path + " is gone");
  if (!PreadAll(fd.fd, dst, meta.bytes(), DataOffset(meta))) return IoError("reading " + path);
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
  unlink(PathOf(id).c_str());
}

}  // namespace trellis::store
