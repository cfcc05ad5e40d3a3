// MappedFile: a read-only memory map of a whole file (RAII, move-only).
//
// Model weights are read in place from the map; nothing is copied. The map is
// private and read-only, so a bug cannot write to the user's model file.
//
// Thread safety: immutable after Open(); data() may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "util/status.h"

namespace trellis {

class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path);
  // Bytes already in memory, shown as a mapped file (an in-memory Env's): kept alive by
  // `owner` as long as the MappedFile, never unmapped.
  static MappedFile FromMemory(std::string path, std::shared_ptr<const std::string> owner);

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  std::shared_ptr<const std::string> owner_;  // FromMemory: the bytes; else null (mmap)
};

}  // namespace trellis
