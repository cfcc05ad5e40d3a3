// util::Env: the file system and the clock as an object (LevelDB's Env idea), so what
// touches disk or measures time can be handed an Env that fails on purpose or whose clock
// a test moves. Env::Default() is POSIX; util/fault_env.h is
// the fault-injecting one the tests use (ENOSPC, EIO, short writes, fsync failures,
// unsynced data lost to a power cut).
//
// Every call returns a Status whose message names the path and the OS's reason; a
// ReadAt that reaches the end of the file before n bytes is an IoError ("short read"),
// and a WriteAt either writes all n bytes or fails (a short write the OS reports is
// retried; one the OS refuses is the error).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/mapped_file.h"
#include "util/status.h"

namespace trellis {

class File {
 public:
  virtual ~File() = default;
  virtual Status ReadAt(uint64_t offset, void* buf, size_t n) = 0;
  virtual Status WriteAt(uint64_t offset, const void* buf, size_t n) = 0;
  virtual Status Sync() = 0;
  virtual Status Truncate(uint64_t size) = 0;
  virtual Result<uint64_t> Size() = 0;
};

enum class OpenMode {
  kRead,       // an existing file, read only
  kReadWrite,  // read and write, created if absent
  kTruncate,   // write only, created or emptied
};

class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();  // POSIX; lives for the whole process

  virtual Result<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode) = 0;
  // Creates a directory; one that exists already is fine.
  virtual Status CreateDir(const std::string& path) = 0;
  // The names in a directory (not "." or "..").
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;
  // The whole file mapped read only (model weights are read in place). Default: mmap.
  virtual Result<MappedFile> MapReadOnly(const std::string& path);
  // Monotonic time in nanoseconds, what durations are measured with (a test's Env may
  // move it by hand). Default: steady_clock.
  virtual int64_t NowNanos();
  double NowSeconds() { return static_cast<double>(NowNanos()) * 1e-9; }
};

}  // namespace trellis
