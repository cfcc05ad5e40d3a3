#include "model/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>

#include <fmt/core.h>

namespace trellis {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 4;
constexpr int kMaxDims = 4;
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;
// Counts in the header are only upper-bounded by the file size, so a corrupt count in a
// multi-gigabyte file could ask for hundreds of gigabytes up front. Reserve at most this
// many entries; the vectors grow past it only as entries actually parse.
constexpr uint64_t kMaxReserve = 4096;

// Bounds-checked little-endian cursor over the header bytes.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> b) : b_(b) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return b_.size() - pos_; }

  template <typename T>
  Status Read(T* out, const char* what) {
    if (remaining() < sizeof(T)) {
      return Corrupt(fmt::format("truncated at byte {} reading {} ({} bytes needed, {} left)",
                                 pos_, what, sizeof(T), remaining()));
    }
    std::memcpy(out, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status ReadString(std::string* out, const char* what) {
    uint64_t len = 0;
    TRELLIS_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining() || len > kMaxStringBytes) {
      return Corrupt(fmt::format("{} at byte {} claims {} bytes, only {} left", what,
                                 pos_ - 8, len, remaining()));
    }
    out->assign(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

 private:
  std::span<const uint8_t> b_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one element, to reject counts the file cannot hold before
// reserving memory for them.
uint64_t MinEncodedSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString: return 8;
    case GgufValueType::kArray: return 12;
  }
  return 1;
}

bool ValidType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

Status ReadScalar(Cursor& c, GgufValueType t, GgufValue* v) {
  v->type = t;
  switch (t) {
    case GgufValueType::kUint8: { uint8_t x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "uint8")); v->u64 = x; v->i64 = x; break; }
    case GgufValueType::kInt8: { int8_t x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "int8")); v->i64 = x; v->u64 = static_cast<uint64_t>(x); break; }
    case GgufValueType::kUint16: { uint16_t x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "uint16")); v->u64 = x; v->i64 = x; break; }
    case GgufValueType::kInt16: { int16_t x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "int16")); v->i64 = x; v->u64 = static_cast<uint64_t>(x); break; }
    case GgufValueType::kUint32: { uint32_t x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "uint32")); v->u64 = x; v->i64 = x; break; }
    case GgufValueType::kInt32: { int32_t x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "int32")); v->i64 = x; v->u64 = static_cast<uint64_t>(x); break; }
    case GgufValueType::kUint64: { uint64_t x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "uint64")); v->u64 = x; v->i64 = static_cast<int64_t>(x); break; }
    case GgufValueType::kInt64: { int64_t x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "int64")); v->i64 = x; v->u64 = static_cast<uint64_t>(x); break; }
    case GgufValueType::kFloat32: { float x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "float32")); v->f64 = x; break; }
    case GgufValueType::kFloat64: { double x{}; TRELLIS_RETURN_IF_ERROR(c.Read(&x, "float64")); v->f64 = x; break; }
    case GgufValueType::kBool: {
      uint8_t x;
      TRELLIS_RETURN_IF_ERROR(c.Read(&x, "bool"));
      if (x > 1) return Corrupt(fmt::format("bool value {} at byte {} is not 0 or 1", x, c.pos() - 1));
      v->u64 = x;
      v->i64 = x;
      break;
    }
    case GgufValueType::kString: TRELLIS_RETURN_IF_ERROR(c.ReadString(&v->str, "string value")); break;
    case GgufValueType::kArray: return Internal("ReadScalar on array");
  }
  return Status::Ok();
}

Status ReadValue(Cursor& c, GgufValueType t, GgufValue* v, int depth) {
  if (t != GgufValueType::kArray) return ReadScalar(c, t, v);
  if (depth >= kMaxArrayDepth) return Corrupt(fmt::format("arrays nested deeper than {}", kMaxArrayDepth));
  v->type = t;
  uint32_t et = 0;
  TRELLIS_RETURN_IF_ERROR(c.Read(&et, "array element type"));
  if (!ValidType(et)) return Corrupt(fmt::format("array element type {} at byte {} is unknown", et, c.pos() - 4));
  v->elem_type = static_cast<GgufValueType>(et);
  TRELLIS_RETURN_IF_ERROR(c.Read(&v->count, "array length"));
  if (v->count > c.remaining() / MinEncodedSize(v->elem_type)) {
    return Corrupt(fmt::format("array of {} {} at byte {} cannot fit in the {} bytes left", v->count,
                               GgufValueTypeName(v->elem_type), c.pos() - 8, c.remaining()));
  }
  const size_t n = static_cast<size_t>(v->count);
  switch (v->elem_type) {
    case GgufValueType::kString:
      v->strings.resize(n);
      for (size_t i = 0; i < n; ++i) TRELLIS_RETURN_IF_ERROR(c.ReadString(&v->strings[i], "array string"));
      break;
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64:
      v->floats.resize(n);
      for (size_t i = 0; i < n; ++i) {
        GgufValue e;
        TRELLIS_RETURN_IF_ERROR(ReadScalar(c, v->elem_type, &e));
        v->floats[i] = e.f64;
      }
      break;
    case GgufValueType::kArray:
      v->nested.resize(n);
      for (size_t i = 0; i < n; ++i) TRELLIS_RETURN_IF_ERROR(ReadValue(c, GgufValueType::kArray, &v->nested[i], depth + 1));
      break;
    default:
      v->ints.resize(n);
      for (size_t i = 0; i < n; ++i) {
        GgufValue e;
        TRELLIS_RETURN_IF_ERROR(ReadScalar(c, v->elem_type, &e));
        v->ints[i] = e.i64;
      }
      break;
  }
  return Status::Ok();
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

std::string_view GgufValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

bool GgufValue::IsInteger() const {
  switch (type) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kUint16:
    case GgufValueType::kInt16: case GgufValueType::kUint32: case GgufValueType::kInt32:
    case GgufValueType::kUint64: case GgufValueType::kInt64: return true;
    default: return false;
  }
}

std::string GgufValue::ToString() const {
  switch (type) {
    case GgufValueType::kString: {
      std::string s = str.size() > 60 ? str.substr(0, 57) + "..." : str;
      for (char& ch : s) if (ch == '\n') ch = ' ';
      return "\"" + s + "\"";
    }
    case GgufValueType::kBool: return u64 ? "true" : "false";
    case GgufValueType::kFloat32: case GgufValueType::kFloat64: return fmt::format("{:g}", f64);
    case GgufValueType::kUint8: case GgufValueType::kUint16: case GgufValueType::kUint32:
    case GgufValueType::kUint64: return std::to_string(u64);
    case GgufValueType::kInt8: case GgufValueType::kInt16: case GgufValueType::kInt32:
    case GgufValueType::kInt64: return std::to_string(i64);
    case GgufValueType::kArray: {
      std::string s = "[";
      if (count <= 8 && elem_type != GgufValueType::kArray) {
        for (uint64_t i = 0; i < count; ++i) {
          if (i) s += ", ";
          if (!strings.empty()) s += "\"" + strings[i] + "\"";
          else if (!floats.empty()) s += fmt::format("{:g}", floats[i]);
          else if (!ints.empty()) s += std::to_string(ints[i]);
        }
        return s + "]";
      }
      return fmt::format("[{} x {}]", count, GgufValueTypeName(elem_type));
    }
  }
  return "?";
}

Result<GgufFile> GgufFile::Open(const std::string& path, Env* env) {
  auto mapped = env->MapReadOnly(path);
  if (!mapped.ok()) return mapped.status();
  auto file = std::make_unique<MappedFile>(std::move(mapped).value());
  auto parsed = Parse(file->bytes());
  if (!parsed.ok()) return parsed.status().WithContext(path);
  GgufFile g = std::move(parsed).value();
  g.file_ = std::move(file);
  g.path_ = path;
  return g;
}

Result<GgufFile> GgufFile::Parse(std::span<const uint8_t> bytes) {
  // Metadata is copied out of the file, so a file can legitimately need several times its
  // size in memory (an array of n uint8 becomes n int64). Running out is reported, not thrown.
  try {
    return ParseUnchecked(bytes);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(fmt::format("out of memory parsing a {}-byte GGUF header", bytes.size()));
  } catch (const std::length_error&) {
    return ResourceExhausted(fmt::format("out of memory parsing a {}-byte GGUF header", bytes.size()));
  }
}

Result<GgufFile> GgufFile::ParseUnchecked(std::span<const uint8_t> bytes) {
  GgufFile g;
  Cursor c(bytes);
  uint32_t magic = 0;
  TRELLIS_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != kGgufMagic) return Corrupt(fmt::format("not a GGUF file (magic 0x{:08x})", magic));
  TRELLIS_RETURN_IF_ERROR(c.Read(&g.version_, "version"));
  if (g.version_ != 0 && (g.version_ & 0xffff) == 0) {
    return Unsupported(fmt::format("GGUF version 0x{:08x} looks byte-swapped: big-endian files are not supported", g.version_));
  }
  if (g.version_ == 1) return Unsupported("GGUF version 1 (32-bit counts) is not supported; re-convert the model");
  if (g.version_ != 2 && g.version_ != 3) return Unsupported(fmt::format("GGUF version {} is not supported (2 and 3 are)", g.version_));
  uint64_t n_tensors = 0, n_kv = 0;
  TRELLIS_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor count"));
  TRELLIS_RETURN_IF_ERROR(c.Read(&n_kv, "metadata count"));
  // Each key-value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info
  // at least 8 + 4 + 4 + 8 bytes.
  if (n_kv > c.remaining() / 13) return Corrupt(fmt::format("metadata count {} cannot fit in the file", n_kv));
  if (n_tensors > c.remaining() / 24) return Corrupt(fmt::format("tensor count {} cannot fit in the file", n_tensors));

  g.kv_.reserve(std::min(n_kv, kMaxReserve));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    TRELLIS_RETURN_IF_ERROR(c.ReadString(&key, "metadata key"));
    uint32_t t = 0;
    TRELLIS_RETURN_IF_ERROR(c.Read(&t, "metadata value type"));
    if (!ValidType(t)) return Corrupt(fmt::format("metadata '{}' has unknown value type {}", key, t));
    GgufValue v;
    Status s = ReadValue(c, static_cast<GgufValueType>(t), &v, 0);
    if (!s.ok()) return s.WithContext(fmt::format("metadata '{}'", key));
    if (g.kv_index_.count(key)) return Corrupt(fmt::format("metadata key '{}' appears twice", key));
    g.kv_index_.emplace(key, g.kv_.size());
    g.kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = g.Find("general.alignment")) {
    if (!a->IsInteger()) {
      return Corrupt(fmt::format("general.alignment is {}, expected an unsigned integer", GgufValueTypeName(a->type)));
    }
    if (a->u64 == 0 || (a->u64 & (a->u64 - 1)) != 0 || a->u64 > (uint64_t{1} << 20)) {
      return Corrupt(fmt::format("general.alignment {} is not a power of two between 1 and 2^20", a->ToString()));
    }
    g.alignment_ = a->u64;
  }

  g.tensors_.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo ti;
    TRELLIS_RETURN_IF_ERROR(c.ReadString(&ti.name, "tensor name"));
    auto ctx = [&](const std::string& m) { return Corrupt(fmt::format("tensor '{}': {}", ti.name, m)); };
    uint32_t n_dims = 0;
    TRELLIS_RETURN_IF_ERROR(c.Read(&n_dims, "tensor dimension count"));
    if (n_dims == 0 || n_dims > kMaxDims) return ctx(fmt::format("{} dimensions (1 to {} allowed)", n_dims, kMaxDims));
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      TRELLIS_RETURN_IF_ERROR(c.Read(&ne, "tensor dimension"));
      if (ne == 0 || ne > (uint64_t{1} << 40)) return ctx(fmt::format("dimension {} is {}", d, ne));
      if (MulOverflows(n_elements, ne, &n_elements) || n_elements > (uint64_t{1} << 42)) {
        return ctx("element count overflows");
      }
      ti.dims.push_back(static_cast<int64_t>(ne));
    }
    uint32_t type = 0;
    TRELLIS_RETURN_IF_ERROR(c.Read(&type, "tensor type"));
    const GgmlTypeTraits tr = GetGgmlTypeTraits(type);
    if (tr.block_elems == 0) return ctx(fmt::format("unknown tensor type id {}", type));
    ti.type = static_cast<GgmlType>(type);
    if (ti.dims[0] % tr.block_elems != 0) {
      return ctx(fmt::format("row length {} is not a multiple of the {} block size {}", ti.dims[0], tr.name, tr.block_elems));
    }
    TRELLIS_RETURN_IF_ERROR(c.Read(&ti.offset, "tensor offset"));
    if (ti.offset % g.alignment_ != 0) return ctx(fmt::format("offset {} is not aligned to {}", ti.offset, g.alignment_));
    ti.n_elements = static_cast<int64_t>(n_elements);
    ti.size_bytes = n_elements / static_cast<uint64_t>(tr.block_elems) * static_cast<uint64_t>(tr.block_bytes);
    if (g.tensor_index_.count(ti.name)) return Corrupt(fmt::format("tensor '{}' appears twice", ti.name));
    g.tensor_index_.emplace(ti.name, g.tensors_.size());
    g.tensors_.push_back(std::move(ti));
  }

  // The data section starts at the next multiple of the alignment.
  uint64_t data = c.pos();
  data = (data + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  g.data_offset_ = data;
  for (GgufTensorInfo& ti : g.tensors_) {
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(data, ti.offset, &begin) || __builtin_add_overflow(begin, ti.size_bytes, &end)) {
      return Corrupt(fmt::format("tensor '{}': offset {} + {} bytes overflows", ti.name, ti.offset, ti.size_bytes));
    }
    if (end > bytes.size()) {
      return Corrupt(fmt::format("tensor '{}': data [{}, +{}) extends past the end of the file ({} bytes); truncated?",
                                 ti.name, begin, ti.size_bytes, bytes.size()));
    }
    ti.data = bytes.data() + begin;
  }
  // Two tensors must not share bytes: a weight aliasing another is corruption, and the
  // engine may one day write through a private copy. (llama.cpp is stricter still: it
  // wants the offsets packed in file order; we accept gaps and any order.)
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(g.tensors_.size());
  for (const GgufTensorInfo& ti : g.tensors_) by_offset.push_back(&ti);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& prev = *by_offset[i - 1];
    const GgufTensorInfo& cur = *by_offset[i];
    if (prev.offset + prev.size_bytes > cur.offset) {
      return Corrupt(fmt::format("tensor '{}' at offset {} overlaps tensor '{}' at [{}, +{})", cur.name,
                                 cur.offset, prev.name, prev.offset, prev.size_bytes));
    }
  }
  return g;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return NotFound(fmt::format("metadata '{}' is missing", key));
  if (v->type != GgufValueType::kString) return InvalidArgument(fmt::format("metadata '{}' is {}, expected string", key, GgufValueTypeName(v->type)));
  return v->str;
}

Result<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return NotFound(fmt::format("metadata '{}' is missing", key));
  if (!v->IsInteger()) return InvalidArgument(fmt::format("metadata '{}' is {}, expected an integer", key, GgufValueTypeName(v->type)));
  const bool is_signed = v->type == GgufValueType::kInt8 || v->type == GgufValueType::kInt16 ||
                         v->type == GgufValueType::kInt32 || v->type == GgufValueType::kInt64;
  if (is_signed && v->i64 < 0) return InvalidArgument(fmt::format("metadata '{}' is negative ({})", key, v->i64));
  return v->u64;
}

Result<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return NotFound(fmt::format("metadata '{}' is missing", key));
  if (v->type == GgufValueType::kFloat32 || v->type == GgufValueType::kFloat64) return v->f64;
  if (v->IsInteger()) return static_cast<double>(v->i64);
  return InvalidArgument(fmt::format("metadata '{}' is {}, expected a number", key, GgufValueTypeName(v->type)));
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return NotFound(fmt::format("metadata '{}' is missing", key));
  if (v->type != GgufValueType::kBool) return InvalidArgument(fmt::format("metadata '{}' is {}, expected bool", key, GgufValueTypeName(v->type)));
  return v->u64 != 0;
}

Result<const GgufValue*> GgufFile::GetArray(std::string_view key, GgufValueType elem_type) const {
  const GgufValue* v = Find(key);
  if (!v) return NotFound(fmt::format("metadata '{}' is missing", key));
  if (v->type != GgufValueType::kArray) return InvalidArgument(fmt::format("metadata '{}' is {}, expected an array", key, GgufValueTypeName(v->type)));
  const bool float_ok = (elem_type == GgufValueType::kFloat32 || elem_type == GgufValueType::kFloat64) &&
                        (v->elem_type == GgufValueType::kFloat32 || v->elem_type == GgufValueType::kFloat64);
  const bool int_ok = elem_type != GgufValueType::kString && elem_type != GgufValueType::kArray && !float_ok &&
                      !v->ints.empty() == (v->count > 0) && v->elem_type != GgufValueType::kString &&
                      v->elem_type != GgufValueType::kArray && v->elem_type != GgufValueType::kFloat32 &&
                      v->elem_type != GgufValueType::kFloat64;
  if (v->elem_type != elem_type && !float_ok && !int_ok) {
    return InvalidArgument(fmt::format("metadata '{}' is an array of {}, expected {}", key, GgufValueTypeName(v->elem_type), GgufValueTypeName(elem_type)));
  }
  return v;
}

}  // namespace trellis
