// FaultEnv: an Env (util/env.h) over another one that fails on purpose, for tests of what
// writes to disk. Each fault can be switched on and off while the code under test runs
// (the switches are atomic):
//   - space: writes succeed until `space_left` bytes have been written, then a write is
//     cut short where the space ends and fails with ENOSPC's message (as a full disk
//     does: the bytes that fit are on disk);
//   - EIO on reads, on writes (nothing written), on syncs, on renames;
//   - a power cut: LoseUnsyncedData() truncates every file written through this Env to
//     the size it had at its last Sync (0 if never synced), as a crash of the machine
//     loses what the page cache held. Renames carry a file's synced size with it.
//     LoseUnsyncedData(seed) with a nonzero seed tears instead: each file's unsynced tail
//     is lost, kept whole, or torn: cut somewhere or kept at its length, and some of the
//     4 KiB pages that remain read back as zeros or garbage (pages reach the disk in any order; an extent may be allocated before
//     its data is written).
//   - EIO on maps (MapReadOnly: a model file that cannot be read);
//   - a clock the test moves (fake_now, Advance) instead of the base's.
// Counts of the faults it injected are kept, so a test can tell its faults happened.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "util/env.h"

namespace trellis {

class FaultEnv final : public Env {
 public:
  explicit FaultEnv(Env* base = Env::Default()) : base_(base) {}

  std::atomic<uint64_t> space_left{std::numeric_limits<uint64_t>::max()};
  std::atomic<bool> fail_reads{false}, fail_writes{false}, fail_syncs{false}, fail_renames{false};
  std::atomic<bool> fail_maps{false};  // MapReadOnly fails with EIO's message
  // The clock: 0 = the base Env's; else this many nanoseconds, moved by Advance.
  std::atomic<int64_t> fake_now{0};
  void Advance(int64_t ns) { fake_now += ns; }
  std::atomic<uint64_t> injected{0};  // faults returned

  void LoseUnsyncedData(uint64_t seed = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t x = seed;
    auto next = [&x] {  // splitmix64: enough randomness for where a tear falls
      uint64_t z = (x += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    for (const auto& [path, synced] : synced_) {
      auto f = base_->Open(path, OpenMode::kReadWrite);
      if (!f.ok()) continue;
      auto size = (*f)->Size();
      if (!size.ok() || *size <= synced) continue;
      const uint64_t unsynced = *size - synced;
      // A quarter of the files lose their whole tail, a quarter keep it whole (written
      // back before the cut), a quarter are cut somewhere in it, and a quarter keep their
      // length with pages that never got their data (the size reached the journal, the
      // data did not).
      const uint64_t fate = seed == 0 ? 0 : next() % 4;
      if (fate == 1) continue;
      const uint64_t keep = fate == 0 ? 0 : fate == 2 ? next() % (unsynced + 1) : unsynced;
      (void)(*f)->Truncate(synced + keep);
      for (uint64_t page = synced / 4096 * 4096; page < synced + keep; page += 4096) {
        const uint64_t from = std::max(page, synced), to = std::min(page + 4096, synced + keep);
        const uint64_t roll = next() % 4;  // 0: zeros, 1: garbage, else: the data made it
        if (roll >= 2) continue;
        std::vector<uint8_t> junk(to - from, 0);
        if (roll == 1) {
          for (auto& b : junk) b = static_cast<uint8_t>(next());
        }
        (void)(*f)->WriteAt(from, junk.data(), junk.size());
      }
    }
  }

  Result<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override {
    auto f = base_->Open(path, mode);
    if (!f.ok()) return f.status();
    if (mode != OpenMode::kRead) {
      std::lock_guard<std::mutex> lock(mu_);
      if (mode == OpenMode::kTruncate || !synced_.count(path)) synced_[path] = mode == OpenMode::kTruncate ? 0 : Synced(**f);
    }
    return std::unique_ptr<File>(new FaultFile(this, path, std::move(f).value()));
  }
  Status CreateDir(const std::string& path) override { return base_->CreateDir(path); }
  Result<MappedFile> MapReadOnly(const std::string& path) override {
    if (fail_maps) {
      ++injected;
      return IoError("cannot mmap '" + path + "': Input/output error (injected)");
    }
    return base_->MapReadOnly(path);
  }
  int64_t NowNanos() override {
    const int64_t t = fake_now;
    return t != 0 ? t : base_->NowNanos();
  }
  Result<std::vector<std::string>> ListDir(const std::string& path) override { return base_->ListDir(path); }
  Status Rename(const std::string& from, const std::string& to) override {
    if (fail_renames) return Inject("renaming " + from + ": Input/output error");
    TRELLIS_RETURN_IF_ERROR(base_->Rename(from, to));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = synced_.find(from);
    if (it != synced_.end()) {
      synced_[to] = it->second;
      synced_.erase(it);
    } else {
      synced_.erase(to);
    }
    return Status::Ok();
  }
  Status Remove(const std::string& path) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      synced_.erase(path);
    }
    return base_->Remove(path);
  }

 private:
  class FaultFile final : public File {
   public:
    FaultFile(FaultEnv* env, std::string path, std::unique_ptr<File> f) : env_(env), path_(std::move(path)), f_(std::move(f)) {}
    Status ReadAt(uint64_t off, void* buf, size_t n) override {
      if (env_->fail_reads) return env_->Inject("reading " + path_ + ": Input/output error");
      return f_->ReadAt(off, buf, n);
    }
    Status WriteAt(uint64_t off, const void* buf, size_t n) override {
      if (env_->fail_writes) return env_->Inject("writing " + path_ + ": Input/output error");
      uint64_t left = env_->space_left.load();
      while (true) {
        const uint64_t take = std::min<uint64_t>(left, n);
        if (env_->space_left.compare_exchange_weak(left, left - take)) {
          if (take > 0) TRELLIS_RETURN_IF_ERROR(f_->WriteAt(off, buf, take));
          if (take < n) return env_->Inject("writing " + path_ + ": No space left on device");
          return Status::Ok();
        }
      }
    }
    Status Sync() override {
      if (env_->fail_syncs) return env_->Inject("syncing " + path_ + ": Input/output error");
      TRELLIS_RETURN_IF_ERROR(f_->Sync());
      auto size = f_->Size();
      std::lock_guard<std::mutex> lock(env_->mu_);
      if (size.ok() && env_->synced_.count(path_)) env_->synced_[path_] = *size;
      return Status::Ok();
    }
    Status Truncate(uint64_t size) override { return f_->Truncate(size); }
    Result<uint64_t> Size() override { return f_->Size(); }

   private:
    FaultEnv* env_;
    std::string path_;
    std::unique_ptr<File> f_;
  };

  static uint64_t Synced(File& f) {
    auto s = f.Size();  // a file that was there when opened counts as on disk
    return s.ok() ? *s : 0;
  }
  Status Inject(const std::string& what) {
    ++injected;
    return IoError(what);
  }

  Env* base_;
  std::mutex mu_;
  std::map<std::string, uint64_t> synced_;  // files written through this Env: size at last sync
};

}  // namespace trellis
