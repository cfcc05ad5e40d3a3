// Wire encoding for Trellis's peer protocols: little-endian fixed-width integers and
// length-prefixed byte strings, written and read with every length checked.
//
// A peer's message is hostile input. WireReader never reads past its span, never
// allocates from a length it has not checked against the bytes that remain, and turns the
// first violation into a sticky failure: every later read returns zero / empty, and
// ok() is false. Callers read a whole message, then check ok() (and Done() when nothing
// may follow) once, instead of checking every field.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace trellis::net {

class WireWriter {
 public:
  void U8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Fixed(v); }
  void U32(uint32_t v) { Fixed(v); }
  void U64(uint64_t v) { Fixed(v); }
  void F64(double v) {
    uint64_t u;
    std::memcpy(&u, &v, sizeof u);
    Fixed(u);
  }
  // u32 length, then the bytes.
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    buf_.append(s);
  }
  void Raw(std::span<const uint8_t> b) { buf_.append(reinterpret_cast<const char*>(b.data()), b.size()); }
  size_t size() const { return buf_.size(); }
  std::string Take() { return std::move(buf_); }

 private:
  template <typename T>
  void Fixed(T v) {
    char b[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    buf_.append(b, sizeof(T));
  }
  std::string buf_;
};

class WireReader {
 public:
  explicit WireReader(std::string_view data) : data_(data) {}

  uint8_t U8() { return Fixed<uint8_t>(); }
  uint16_t U16() { return Fixed<uint16_t>(); }
  uint32_t U32() { return Fixed<uint32_t>(); }
  uint64_t U64() { return Fixed<uint64_t>(); }
  double F64() {
    const uint64_t u = U64();
    double v;
    std::memcpy(&v, &u, sizeof v);
    return v;
  }
  // A u32-prefixed string of at most max_len bytes (a view into the message).
  std::string_view Str(size_t max_len) {
    const uint32_t n = U32();
    if (!ok_ || n > max_len || n > remaining()) return Fail();
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // An element count of at most max_count, each element at least min_elem_bytes long:
  // the count is refused unless that many elements could fit in what remains, so a
  // count is never trusted to size an allocation.
  uint32_t Count(uint32_t max_count, size_t min_elem_bytes) {
    const uint32_t n = U32();
    if (!ok_ || n > max_count || static_cast<uint64_t>(n) * min_elem_bytes > remaining()) {
      Fail();
      return 0;
    }
    return n;
  }
  // Marks the message malformed (a field out of its range, say).
  std::string_view Fail() {
    ok_ = false;
    pos_ = data_.size();
    return {};
  }
  bool ok() const { return ok_; }
  // All bytes consumed and no failure.
  bool Done() const { return ok_ && pos_ == data_.size(); }
  size_t remaining() const { return data_.size() - pos_; }

 private:
  template <typename T>
  T Fixed() {
    if (!ok_ || remaining() < sizeof(T)) {
      Fail();
      return 0;
    }
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace trellis::net
