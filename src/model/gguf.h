// GGUF reader (v2 and v3) over a memory map, with a bounds-checked parser.
//
// GgufFile::Parse validates the whole header up front: every string length, array
// count, tensor dimension, type, offset and size is checked against the bytes that
// are actually there, so a truncated, corrupt or hostile file yields a Status naming
// what is wrong and never an out-of-bounds read. After a successful parse, tensor data
// pointers are guaranteed to lie inside the buffer. The on-disk format as we read it
// is written down in docs/gguf.md.
//
// Thread safety: immutable after Open/Parse; const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/ggml_type.h"
#include "util/mapped_file.h"
#include "util/env.h"
#include "util/status.h"

namespace trellis {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view GgufValueTypeName(GgufValueType t);

// One metadata value. Scalars use one of u64/i64/f64/str; arrays keep their elements in
// the member matching elem_type (integers and bools in ints, floats in floats, strings in
// strings, arrays of arrays in nested), so a 128k-entry vocab is not 128k variants.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  uint64_t u64 = 0;  // unsigned integers and bool
  int64_t i64 = 0;   // signed integers
  double f64 = 0;    // float32 / float64
  std::string str;
  // Arrays only:
  GgufValueType elem_type = GgufValueType::kUint8;
  uint64_t count = 0;
  std::vector<int64_t> ints;  // integer and bool elements (uint64 values above 2^63 wrap)
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<GgufValue> nested;

  bool IsInteger() const;
  // Short human-readable rendering ("[32000 strings]" for long arrays).
  std::string ToString() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne[0] first: ne[0] is the row length (contiguous)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;        // relative to the start of the data section
  uint64_t size_bytes = 0;
  int64_t n_elements = 0;
  const uint8_t* data = nullptr;  // inside the file's buffer
};

class GgufFile {
 public:
  // Maps the file and parses it. Errors name the file and what is wrong.
  static Result<GgufFile> Open(const std::string& path, Env* env = Env::Default());
  // Parses a buffer the caller keeps alive for the GgufFile's lifetime (fuzzing, tests).
  static Result<GgufFile> Parse(std::span<const uint8_t> bytes);

  GgufFile(GgufFile&&) = default;
  GgufFile& operator=(GgufFile&&) = default;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::string& path() const { return path_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  // Typed getters: NotFound if absent, InvalidArgument naming the key if the type is
  // wrong or the value does not fit.
  Result<std::string> GetString(std::string_view key) const;
  Result<uint64_t> GetUint(std::string_view key) const;  // any non-negative integer type
  Result<double> GetFloat(std::string_view key) const;   // float32/64 or integer
  Result<bool> GetBool(std::string_view key) const;
  Result<const GgufValue*> GetArray(std::string_view key, GgufValueType elem_type) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  // Parse without the out-of-memory guard.
  static Result<GgufFile> ParseUnchecked(std::span<const uint8_t> bytes);

  std::unique_ptr<MappedFile> file_;  // null when parsed from a caller's buffer
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace trellis
