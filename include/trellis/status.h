// Status and Result<T>: errors as values, shaped like absl::Status / std::expected.
//
// Every fallible operation across a layer boundary returns Status or Result<T>.
// Codes are grouped by what the caller does about them, not by where they arose:
// kResourceExhausted means "evict, shrink, queue or retry", never "give up".
//
// Thread safety: value types; no shared state.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace trellis {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller's input is malformed or out of range
  kNotFound,           // a named thing (file, key, tensor) does not exist
  kCorrupt,            // data on disk or wire violates its format
  kUnsupported,        // well-formed, but a feature we do not implement
  kResourceExhausted,  // a pool or queue is full: evict, shrink or retry
  kIoError,            // the OS refused a read, write, open or map
  kCancelled,          // the caller asked to stop
  kUnavailable,        // a peer or service is not reachable now
  kDeadlineExceeded,   // the operation's deadline passed before it completed
  kInternal,           // a bug surfaced as an error at an API edge
  kFailedPrecondition,  // well-formed, but the state does not allow it (data stored in another layout)
  // (new codes go last: codes travel on the wire as numbers; kLastCode names the last)
};
inline constexpr StatusCode kLastStatusCode = StatusCode::kFailedPrecondition;

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CORRUPT: tensor 'blk.0.attn_q.weight': data extends past end of file".
  std::string ToString() const;

  // Returns a copy with `context + ": "` prepended to the message.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T> holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }

  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<1>(v_);
  }
  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace trellis

#define TRELLIS_CONCAT_INNER_(a, b) a##b
#define TRELLIS_CONCAT_(a, b) TRELLIS_CONCAT_INNER_(a, b)

// Returns early from the enclosing function if `expr` (a Status) is not OK.
#define TRELLIS_RETURN_IF_ERROR(...)                    \
  do {                                                  \
    ::trellis::Status trellis_status_ = (__VA_ARGS__);  \
    if (!trellis_status_.ok()) return trellis_status_;  \
  } while (0)

// `TRELLIS_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a Result or returns its error.
#define TRELLIS_ASSIGN_OR_RETURN(lhs, ...) \
  TRELLIS_ASSIGN_OR_RETURN_IMPL_(TRELLIS_CONCAT_(trellis_result_, __LINE__), lhs, __VA_ARGS__)
#define TRELLIS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, ...) \
  auto tmp = (__VA_ARGS__);                           \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

// Invariant check that stays on in release builds: a broken invariant is a bug, so abort
// with a message rather than serve a wrong answer.
#define TRELLIS_CHECK(cond)                                               \
  do {                                                                    \
    if (!(cond)) ::trellis::internal::CheckFailed(#cond, __FILE__, __LINE__); \
  } while (0)

namespace trellis::internal {
[[noreturn]] void CheckFailed(const char* cond, const char* file, int line);
}  // namespace trellis::internal
