// Parse stacks of a grammar over bytes: the pushdown automaton the token masks run on.
//
// A stack is a chain of frames; a frame is a grammar position (an index into
// Grammar::elements: the next element to match in one alternative) plus the bytes read so
// far of a code point that is not complete yet. Frames are hash-consed in a StackArena, so
// a stack is one 32-bit id, equal stacks have equal ids, and stacks share their common
// bottoms. A stack set (sorted, unique ids) is the state of a nondeterministic parse.
//
// Every stack in a set is "closed": its top is a class or class-star element (references
// expanded, finished alternatives popped); kAccepted is the empty stack (the document is
// complete) and kContext stands for "the frames below", which per-position analysis uses
// to tell tokens decided by the top frame alone from those that depend on the rest.
// References are expanded eagerly, which Grammar::Finish makes safe (no left recursion);
// a reference in the last position of an alternative replaces its frame instead of
// pushing (tail calls), so right recursion such as `star ::= X star | ""` runs in constant
// depth.
//
// Thread safety: a StackArena and the StackMachine using it belong to one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "util/status.h"

namespace trellis::grammar {

using StackId = uint32_t;
inline constexpr StackId kAccepted = 0;
inline constexpr StackId kContext = 1;

// Up to 3 bytes of an incomplete UTF-8 sequence: bytes in bits 0-23, count in 24-31.
using Utf8Partial = uint32_t;

struct Frame {
  uint32_t pos = 0;
  Utf8Partial utf8 = 0;
  StackId parent = kAccepted;
};

class StackArena {
 public:
  StackArena() { Clear(); }
  StackId Intern(uint32_t pos, Utf8Partial utf8, StackId parent);
  const Frame& frame(StackId id) const { return frames_[id]; }
  size_t size() const { return frames_.size(); }
  void Clear();

 private:
  void Grow();
  std::vector<Frame> frames_;
  std::vector<uint32_t> slots_;  // open addressing over frame ids; kEmptySlot when free
};

// Bound on the stacks of one set: a grammar ambiguous enough to exceed it is refused at
// the step that does (ResourceExhausted), never followed into exponential work.
inline constexpr size_t kMaxStacks = 4096;

class StackMachine {
 public:
  // Both borrowed; they outlive the machine.
  StackMachine(const Grammar& g, StackArena& arena) : g_(g), arena_(arena) {}

  // The closed set of stacks at the start of the document.
  Status Start(std::vector<StackId>& out);
  // The closed set of one stack made of `frames` (top first; their parents ignored) over
  // kContext, or over kAccepted when `whole` (they are a whole stack).
  Status StartLocal(std::span<const Frame> frames, bool whole, std::vector<StackId>& out);
  // Stacks of `in` that can read `byte`, advanced and closed (kAccepted and kContext read
  // nothing). `out` may not alias `in`.
  Status Advance(std::span<const StackId> in, uint8_t byte, std::vector<StackId>& out);
  Status AdvanceBytes(std::vector<StackId>& set, std::string_view bytes);

  StackArena& arena() { return arena_; }
  const Grammar& grammar() const { return g_; }

 private:
  StackId Next(uint32_t pos, StackId parent);
  void Close(StackId s, std::vector<StackId>& out);
  Status Finish(std::vector<StackId>& out) const;

  const Grammar& g_;
  StackArena& arena_;
  std::vector<uint32_t> seen_;  // (arena size) epoch of the closure that last expanded a frame
  uint32_t epoch_ = 0;
  std::vector<StackId> work_;
};

// Whether `text` is a complete document of `g` / can still be extended to one (read byte
// by byte from the start; false also when the parse is too ambiguous to follow).
bool Matches(const Grammar& g, std::string_view text);
bool IsPrefix(const Grammar& g, std::string_view text);

// Whether a partial UTF-8 sequence extended by `byte` is still the prefix of (or is) a
// code point in `cls`: returns the new partial state (0 when a code point completed, in
// which case *cp is set) or kNoMatch.
inline constexpr Utf8Partial kNoMatch = 0xFFFFFFFF;
Utf8Partial StepUtf8(const CharClass& cls, Utf8Partial partial, uint8_t byte, uint32_t* cp);

}  // namespace trellis::grammar
