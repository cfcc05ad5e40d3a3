// MemEnv: an Env (util/env.h) whose files live in memory, LevelDB's in-memory Env for
// tests: what reads and writes files (the store's SSD tier, a GGUF writer and reader)
// runs without a disk, each test with a file system of its own, and a FaultEnv can be
// put over it. Directories are names only (CreateDir records one; ListDir lists the
// files under it); Sync does nothing, since nothing is lost but by the test's own hand.
// The clock is the base Env's unless a FaultEnv above moves it.
//
// Thread safety: every method may be called from any thread (one lock).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "util/env.h"

namespace trellis {

class MemEnv final : public Env {
 public:
  Result<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) override;
  Status CreateDir(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Result<MappedFile> MapReadOnly(const std::string& path) override;

  // A file's bytes (tests): NotFound if there is none.
  Result<std::string> Contents(const std::string& path);

 private:
  friend class MemFile;
  std::mutex mu_;
  // The bytes of each file; an open file holds its own pointer, so a renamed or removed
  // file stays readable by whoever has it open (as on POSIX).
  std::map<std::string, std::shared_ptr<std::string>> files_;
  std::set<std::string> dirs_;
};

}  // namespace trellis
