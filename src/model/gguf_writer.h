// GgufWriter: builds a GGUF v3 file (metadata + tensors) for gen-model and tests.
//
// Tensor data is produced by a callback at write time, one tensor at a time, so a
// multi-gigabyte model is never held in memory. The file is written to "<path>.tmp",
// synced and renamed into place, so a reader never sees a half-written model, not even
// after a crash.
//
// Thread safety: not thread-safe; build and write from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "util/env.h"
#include "util/status.h"

namespace trellis {

class GgufWriter {
 public:
  // Fills `dst` (exactly the tensor's byte size) with the tensor's data.
  using FillFn = std::function<Status(std::span<uint8_t> dst)>;

  explicit GgufWriter(uint64_t alignment = 32) : alignment_(alignment) {}

  void SetValue(const std::string& key, GgufValue value);  // replaces an existing key
  void SetString(const std::string& key, std::string v);
  void SetUint32(const std::string& key, uint32_t v);
  void SetInt32(const std::string& key, int32_t v);
  void SetUint64(const std::string& key, uint64_t v);
  void SetFloat32(const std::string& key, float v);
  void SetBool(const std::string& key, bool v);
  void SetStringArray(const std::string& key, std::vector<std::string> v);
  void SetFloat32Array(const std::string& key, std::vector<float> v);
  void SetInt32Array(const std::string& key, std::vector<int32_t> v);

  // dims: ne[0] (row length) first. dims[0] must be a multiple of the type's block size.
  Status AddTensor(const std::string& name, std::vector<int64_t> dims, GgmlType type, FillFn fill);
  // Convenience: copies `data`, which must be exactly the tensor's size.
  Status AddTensorData(const std::string& name, std::vector<int64_t> dims, GgmlType type,
                       std::span<const uint8_t> data);

  // Writes "<path>.tmp" through `env` (util/env.h; nullptr: the POSIX one), syncs it and
  // renames it into place. On any failure (a full disk, EIO) the temp file is removed and
  // nothing is at `path` that was not there before.
  Status WriteFile(const std::string& path, Env* env = nullptr) const;
  // Serializes to memory (small files, tests).
  Result<std::vector<uint8_t>> WriteToBuffer() const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    uint64_t size_bytes;
    FillFn fill;
  };
  template <typename Sink>
  Status WriteTo(Sink& sink) const;

  uint64_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace trellis
