#include "model/gguf_writer.h"

#include <cstring>
#include <memory>
#include <vector>

#include <fmt/core.h>

namespace trellis {
namespace {

class BufferSink {
 public:
  Status Write(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
    return Status::Ok();
  }
  std::vector<uint8_t>& out() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// Appends to a File (util/env.h) through a buffer, so the many small metadata writes
// are few WriteAt calls.
class FileSink {
 public:
  explicit FileSink(File* f) : f_(f) {}
  Status Write(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (buf_.size() + n > kBuffer) TRELLIS_RETURN_IF_ERROR(Flush());
    if (n >= kBuffer) {
      TRELLIS_RETURN_IF_ERROR(f_->WriteAt(offset_, b, n));
      offset_ += n;
      return Status::Ok();
    }
    buf_.insert(buf_.end(), b, b + n);
    return Status::Ok();
  }
  Status Flush() {
    if (buf_.empty()) return Status::Ok();
    TRELLIS_RETURN_IF_ERROR(f_->WriteAt(offset_, buf_.data(), buf_.size()));
    offset_ += buf_.size();
    buf_.clear();
    return Status::Ok();
  }

 private:
  static constexpr size_t kBuffer = 1 << 20;
  File* f_;
  uint64_t offset_ = 0;
  std::vector<uint8_t> buf_;
};

template <typename Sink, typename T>
Status Put(Sink& s, T v) { return s.Write(&v, sizeof(T)); }

template <typename Sink>
Status PutString(Sink& s, const std::string& str) {
  TRELLIS_RETURN_IF_ERROR(Put<Sink, uint64_t>(s, str.size()));
  return s.Write(str.data(), str.size());
}

template <typename Sink>
Status PutScalar(Sink& s, GgufValueType t, uint64_t u, int64_t i, double f) {
  switch (t) {
    case GgufValueType::kUint8: return Put<Sink, uint8_t>(s, static_cast<uint8_t>(u));
    case GgufValueType::kInt8: return Put<Sink, int8_t>(s, static_cast<int8_t>(i));
    case GgufValueType::kUint16: return Put<Sink, uint16_t>(s, static_cast<uint16_t>(u));
    case GgufValueType::kInt16: return Put<Sink, int16_t>(s, static_cast<int16_t>(i));
    case GgufValueType::kUint32: return Put<Sink, uint32_t>(s, static_cast<uint32_t>(u));
    case GgufValueType::kInt32: return Put<Sink, int32_t>(s, static_cast<int32_t>(i));
    case GgufValueType::kUint64: return Put<Sink, uint64_t>(s, u);
    case GgufValueType::kInt64: return Put<Sink, int64_t>(s, i);
    case GgufValueType::kFloat32: return Put<Sink, float>(s, static_cast<float>(f));
    case GgufValueType::kFloat64: return Put<Sink, double>(s, f);
    case GgufValueType::kBool: return Put<Sink, uint8_t>(s, u ? 1 : 0);
    default: return Internal("PutScalar on non-scalar");
  }
}

// Writes `n` zero bytes (alignment padding; n may exceed any fixed buffer).
template <typename Sink>
Status PutZeros(Sink& s, uint64_t n) {
  static const uint8_t kZeros[4096] = {};
  while (n > 0) {
    const size_t chunk = n < sizeof(kZeros) ? static_cast<size_t>(n) : sizeof(kZeros);
    TRELLIS_RETURN_IF_ERROR(s.Write(kZeros, chunk));
    n -= chunk;
  }
  return Status::Ok();
}

// Element vector of an array value, checked against `count` so a hand-built GgufValue
// with too few elements is an error rather than a read past the vector.
size_t HeldElements(const GgufValue& v) {
  switch (v.elem_type) {
    case GgufValueType::kString: return v.strings.size();
    case GgufValueType::kArray: return v.nested.size();
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64: return v.floats.size();
    default: return v.ints.size();
  }
}

template <typename Sink>
Status PutValue(Sink& s, const GgufValue& v) {
  if (v.type == GgufValueType::kString) return PutString(s, v.str);
  if (v.type != GgufValueType::kArray) return PutScalar(s, v.type, v.u64, v.i64, v.f64);
  if (HeldElements(v) != v.count) {
    return InvalidArgument(fmt::format("array of {} {} holds {} elements", v.count, GgufValueTypeName(v.elem_type), HeldElements(v)));
  }
  TRELLIS_RETURN_IF_ERROR(Put<Sink, uint32_t>(s, static_cast<uint32_t>(v.elem_type)));
  TRELLIS_RETURN_IF_ERROR(Put<Sink, uint64_t>(s, v.count));
  for (uint64_t k = 0; k < v.count; ++k) {
    switch (v.elem_type) {
      case GgufValueType::kString: TRELLIS_RETURN_IF_ERROR(PutString(s, v.strings[k])); break;
      case GgufValueType::kArray:
        // An inner array is encoded like a top-level one minus the outer type tag:
        // element type, count, elements.
        if (v.nested[k].type != GgufValueType::kArray) return InvalidArgument("nested element is not an array");
        TRELLIS_RETURN_IF_ERROR(PutValue(s, v.nested[k]));
        break;
      case GgufValueType::kFloat32:
      case GgufValueType::kFloat64: TRELLIS_RETURN_IF_ERROR(PutScalar(s, v.elem_type, 0, 0, v.floats[k])); break;
      default:
        TRELLIS_RETURN_IF_ERROR(PutScalar(s, v.elem_type, static_cast<uint64_t>(v.ints[k]), v.ints[k], 0));
    }
  }
  return Status::Ok();
}

GgufValue Scalar(GgufValueType t) {
  GgufValue v;
  v.type = t;
  return v;
}

}  // namespace

void GgufWriter::SetValue(const std::string& key, GgufValue value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::SetString(const std::string& key, std::string s) {
  GgufValue v = Scalar(GgufValueType::kString);
  v.str = std::move(s);
  SetValue(key, std::move(v));
}
void GgufWriter::SetUint32(const std::string& key, uint32_t x) {
  GgufValue v = Scalar(GgufValueType::kUint32);
  v.u64 = x;
  v.i64 = x;
  SetValue(key, std::move(v));
}
void GgufWriter::SetInt32(const std::string& key, int32_t x) {
  GgufValue v = Scalar(GgufValueType::kInt32);
  v.i64 = x;
  v.u64 = static_cast<uint64_t>(x);
  SetValue(key, std::move(v));
}
void GgufWriter::SetUint64(const std::string& key, uint64_t x) {
  GgufValue v = Scalar(GgufValueType::kUint64);
  v.u64 = x;
  v.i64 = static_cast<int64_t>(x);
  SetValue(key, std::move(v));
}
void GgufWriter::SetFloat32(const std::string& key, float x) {
  GgufValue v = Scalar(GgufValueType::kFloat32);
  v.f64 = x;
  SetValue(key, std::move(v));
}
void GgufWriter::SetBool(const std::string& key, bool x) {
  GgufValue v = Scalar(GgufValueType::kBool);
  v.u64 = x;
  v.i64 = x;
  SetValue(key, std::move(v));
}
void GgufWriter::SetStringArray(const std::string& key, std::vector<std::string> a) {
  GgufValue v = Scalar(GgufValueType::kArray);
  v.elem_type = GgufValueType::kString;
  v.count = a.size();
  v.strings = std::move(a);
  SetValue(key, std::move(v));
}
void GgufWriter::SetFloat32Array(const std::string& key, std::vector<float> a) {
  GgufValue v = Scalar(GgufValueType::kArray);
  v.elem_type = GgufValueType::kFloat32;
  v.count = a.size();
  v.floats.assign(a.begin(), a.end());
  SetValue(key, std::move(v));
}
void GgufWriter::SetInt32Array(const std::string& key, std::vector<int32_t> a) {
  GgufValue v = Scalar(GgufValueType::kArray);
  v.elem_type = GgufValueType::kInt32;
  v.count = a.size();
  v.ints.assign(a.begin(), a.end());
  SetValue(key, std::move(v));
}

Status GgufWriter::AddTensor(const std::string& name, std::vector<int64_t> dims, GgmlType type, FillFn fill) {
  const GgmlTypeTraits tr = GetGgmlTypeTraits(type);
  if (tr.block_elems == 0) return InvalidArgument(fmt::format("tensor '{}': unknown type", name));
  if (dims.empty() || dims.size() > 4) return InvalidArgument(fmt::format("tensor '{}': {} dims", name, dims.size()));
  uint64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0) return InvalidArgument(fmt::format("tensor '{}': dimension {}", name, d));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n > (uint64_t{1} << 42)) {
      return InvalidArgument(fmt::format("tensor '{}': element count overflows", name));
    }
  }
  if (dims[0] % tr.block_elems) {
    return InvalidArgument(fmt::format("tensor '{}': row {} not a multiple of {} block {}", name, dims[0], tr.name, tr.block_elems));
  }
  for (const Tensor& t : tensors_) {
    if (t.name == name) return InvalidArgument(fmt::format("tensor '{}' added twice", name));
  }
  const uint64_t size = n / static_cast<uint64_t>(tr.block_elems) * static_cast<uint64_t>(tr.block_bytes);
  tensors_.push_back({name, std::move(dims), type, size, std::move(fill)});
  return Status::Ok();
}

Status GgufWriter::AddTensorData(const std::string& name, std::vector<int64_t> dims, GgmlType type,
                                 std::span<const uint8_t> data) {
  auto copy = std::make_shared<std::vector<uint8_t>>(data.begin(), data.end());
  TRELLIS_RETURN_IF_ERROR(AddTensor(name, std::move(dims), type, [copy](std::span<uint8_t> dst) {
    if (dst.size() != copy->size()) return InvalidArgument("tensor data has the wrong size");
    std::memcpy(dst.data(), copy->data(), dst.size());
    return Status::Ok();
  }));
  if (tensors_.back().size_bytes != data.size()) {
    return InvalidArgument(fmt::format("tensor '{}': {} bytes given, {} expected", name, data.size(), tensors_.back().size_bytes));
  }
  return Status::Ok();
}

template <typename Sink>
Status GgufWriter::WriteTo(Sink& s) const {
  uint64_t pos = 0;
  auto counting = [&](const void* p, size_t n) {
    pos += n;
    return s.Write(p, n);
  };
  struct Counting {
    decltype(counting)& f;
    Status Write(const void* p, size_t n) { return f(p, n); }
  } cs{counting};

  // The reader accepts power-of-two alignments up to 1 MiB; write nothing it would reject.
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > (uint64_t{1} << 20)) {
    return InvalidArgument(fmt::format("alignment {} is not a power of two up to 1 MiB", alignment_));
  }
  // A caller-set general.alignment is written as given, but must agree with ours.
  bool user_alignment_key = false;
  for (const auto& [key, v] : kv_) {
    if (key != "general.alignment") continue;
    if (!v.IsInteger() || v.u64 != alignment_) {
      return InvalidArgument(fmt::format("general.alignment {} disagrees with the writer's alignment {}", v.ToString(), alignment_));
    }
    user_alignment_key = true;
  }
  TRELLIS_RETURN_IF_ERROR(Put<Counting, uint32_t>(cs, 0x46554747));
  TRELLIS_RETURN_IF_ERROR(Put<Counting, uint32_t>(cs, 3));
  TRELLIS_RETURN_IF_ERROR(Put<Counting, uint64_t>(cs, tensors_.size()));
  const bool has_alignment_key = alignment_ != 32 && !user_alignment_key;
  TRELLIS_RETURN_IF_ERROR(Put<Counting, uint64_t>(cs, kv_.size() + (has_alignment_key ? 1 : 0)));
  for (const auto& [key, v] : kv_) {
    TRELLIS_RETURN_IF_ERROR(PutString(cs, key));
    TRELLIS_RETURN_IF_ERROR(Put<Counting, uint32_t>(cs, static_cast<uint32_t>(v.type)));
    TRELLIS_RETURN_IF_ERROR(PutValue(cs, v));
  }
  if (has_alignment_key) {
    TRELLIS_RETURN_IF_ERROR(PutString(cs, std::string("general.alignment")));
    TRELLIS_RETURN_IF_ERROR(Put<Counting, uint32_t>(cs, static_cast<uint32_t>(GgufValueType::kUint32)));
    TRELLIS_RETURN_IF_ERROR(Put<Counting, uint32_t>(cs, static_cast<uint32_t>(alignment_)));
  }
  auto align_up = [&](uint64_t x) { return (x + alignment_ - 1) / alignment_ * alignment_; };
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    TRELLIS_RETURN_IF_ERROR(PutString(cs, t.name));
    TRELLIS_RETURN_IF_ERROR(Put<Counting, uint32_t>(cs, static_cast<uint32_t>(t.dims.size())));
    for (int64_t d : t.dims) TRELLIS_RETURN_IF_ERROR(Put<Counting, uint64_t>(cs, static_cast<uint64_t>(d)));
    TRELLIS_RETURN_IF_ERROR(Put<Counting, uint32_t>(cs, static_cast<uint32_t>(t.type)));
    TRELLIS_RETURN_IF_ERROR(Put<Counting, uint64_t>(cs, offset));
    offset = align_up(offset + t.size_bytes);
  }
  TRELLIS_RETURN_IF_ERROR(PutZeros(cs, align_up(pos) - pos));
  std::vector<uint8_t> buf;
  for (const Tensor& t : tensors_) {
    buf.assign(t.size_bytes, 0);
    Status st = t.fill(std::span<uint8_t>(buf));
    if (!st.ok()) return st.WithContext(fmt::format("tensor '{}'", t.name));
    TRELLIS_RETURN_IF_ERROR(cs.Write(buf.data(), buf.size()));
    TRELLIS_RETURN_IF_ERROR(PutZeros(cs, align_up(pos) - pos));
  }
  return Status::Ok();
}

Status GgufWriter::WriteFile(const std::string& path, Env* env) const {
  if (env == nullptr) env = Env::Default();
  const std::string tmp = path + ".tmp";
  Status s;
  {
    auto f = env->Open(tmp, OpenMode::kTruncate);
    if (!f.ok()) return f.status().WithContext(path);
    FileSink sink(f->get());
    s = WriteTo(sink);
    if (s.ok()) s = sink.Flush();
    if (s.ok()) s = (*f)->Sync();  // whole on disk before it takes the name
  }
  if (s.ok()) s = env->Rename(tmp, path);
  if (!s.ok()) {
    (void)env->Remove(tmp);
    return s.WithContext(path);
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> GgufWriter::WriteToBuffer() const {
  BufferSink sink;
  TRELLIS_RETURN_IF_ERROR(WriteTo(sink));
  return std::move(sink.out());
}

}  // namespace trellis
