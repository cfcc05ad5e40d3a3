#include "grammar/stacks.h"

#include <algorithm>

#include <fmt/format.h>

namespace trellis::grammar {
namespace {

constexpr uint32_t kEmptySlot = 0xFFFFFFFF;

uint64_t HashFrame(uint32_t pos, Utf8Partial utf8, StackId parent) {
  uint64_t h = (static_cast<uint64_t>(pos) << 32 | parent) * 0x9E3779B97F4A7C15ull;
  h ^= (h >> 29) ^ (static_cast<uint64_t>(utf8) * 0xBF58476D1CE4E5B9ull);
  return h ^ (h >> 32);
}

}  // namespace

void StackArena::Clear() {
  frames_.clear();
  frames_.push_back(Frame{0, 0, kAccepted});  // kAccepted
  frames_.push_back(Frame{0, 0, kContext});   // kContext
  slots_.assign(1024, kEmptySlot);
}

void StackArena::Grow() {
  slots_.assign(slots_.size() * 2, kEmptySlot);
  const size_t mask = slots_.size() - 1;
  for (StackId id = 2; id < frames_.size(); ++id) {
    const Frame& f = frames_[id];
    size_t i = HashFrame(f.pos, f.utf8, f.parent) & mask;
    while (slots_[i] != kEmptySlot) i = (i + 1) & mask;
    slots_[i] = id;
  }
}

StackId StackArena::Intern(uint32_t pos, Utf8Partial utf8, StackId parent) {
  if (frames_.size() * 2 >= slots_.size()) Grow();
  const size_t mask = slots_.size() - 1;
  size_t i = HashFrame(pos, utf8, parent) & mask;
  while (slots_[i] != kEmptySlot) {
    const Frame& f = frames_[slots_[i]];
    if (f.pos == pos && f.utf8 == utf8 && f.parent == parent) return slots_[i];
    i = (i + 1) & mask;
  }
  const auto id = static_cast<StackId>(frames_.size());
  frames_.push_back(Frame{pos, utf8, parent});
  slots_[i] = id;
  return id;
}

Utf8Partial StepUtf8(const CharClass& cls, Utf8Partial partial, uint8_t byte, uint32_t* cp) {
  const uint32_t have = partial >> 24;
  if (have == 0) {
    if (byte < 0x80) {
      if (!cls.Contains(byte)) return kNoMatch;
      *cp = byte;
      return 0;
    }
  } else if ((byte & 0xC0) != 0x80) {
    return kNoMatch;
  }
  uint8_t bytes[4];
  for (uint32_t k = 0; k < have; ++k) bytes[k] = static_cast<uint8_t>(partial >> (8 * k));
  bytes[have] = byte;
  const uint32_t n = have + 1;
  const uint8_t lead = bytes[0];
  uint32_t len = 0, min_cp = 0;
  if (lead >= 0xC0 && lead <= 0xDF) {
    len = 2, min_cp = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3, min_cp = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF7) {
    len = 4, min_cp = 0x10000;
  } else {
    return kNoMatch;  // a continuation byte or 0xF8.. where a sequence should start
  }
  // The code points whose encoding starts with these bytes form one range.
  uint32_t v = lead & (0x7F >> len);
  for (uint32_t k = 1; k < n; ++k) v = (v << 6) | (bytes[k] & 0x3F);
  const uint32_t rest = 6 * (len - n);
  const uint32_t lo = std::max(v << rest, min_cp);
  const uint32_t hi = std::min(((v + 1) << rest) - 1, kMaxCodePoint);
  if (lo > hi || !cls.Intersects(lo, hi)) return kNoMatch;
  if (n == len) {
    *cp = lo;  // lo == hi == v here
    return 0;
  }
  Utf8Partial out = n << 24;
  for (uint32_t k = 0; k < n; ++k) out |= static_cast<uint32_t>(bytes[k]) << (8 * k);
  return out;
}

StackId StackMachine::Next(uint32_t pos, StackId parent) {
  // A frame that would sit on the closing kEnd is its parent (tail call).
  return g_.elements[pos + 1].kind == ElementKind::kEnd ? parent : arena_.Intern(pos + 1, 0, parent);
}

void StackMachine::Close(StackId s, std::vector<StackId>& out) {
  // Depth-first over a work list; a frame expanded once per closure (seen_), so diamonds
  // of nullable rules cost their size, not the number of paths through them.
  if (++epoch_ == 0) {
    std::fill(seen_.begin(), seen_.end(), 0);
    epoch_ = 1;
  }
  work_.clear();
  work_.push_back(s);
  while (!work_.empty()) {
    const StackId id = work_.back();
    work_.pop_back();
    if (id == kAccepted || id == kContext) {
      out.push_back(id);
      continue;
    }
    if (seen_.size() <= id) seen_.resize(std::max<size_t>(arena_.size(), id + 1) * 2, 0);
    if (seen_[id] == epoch_) continue;
    seen_[id] = epoch_;
    const Frame f = arena_.frame(id);
    const Element& el = g_.elements[f.pos];
    switch (el.kind) {
      case ElementKind::kEnd:
        work_.push_back(f.parent);
        break;
      case ElementKind::kClass:
        out.push_back(id);
        break;
      case ElementKind::kClassStar:
        out.push_back(id);
        if (f.utf8 == 0) work_.push_back(Next(f.pos, f.parent));
        break;
      case ElementKind::kRef: {
        const StackId cont = Next(f.pos, f.parent);
        const auto& alts = g_.rules[el.arg].alts;
        for (auto it = alts.rbegin(); it != alts.rend(); ++it) work_.push_back(arena_.Intern(*it, 0, cont));
        break;
      }
    }
  }
}

Status StackMachine::Finish(std::vector<StackId>& out) const {
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.size() > kMaxStacks) {
    return ResourceExhausted(fmt::format("grammar is too ambiguous: more than {} parses at once", kMaxStacks));
  }
  return Status::Ok();
}

Status StackMachine::Start(std::vector<StackId>& out) {
  out.clear();
  for (uint32_t a : g_.rules[g_.root].alts) Close(arena_.Intern(a, 0, kAccepted), out);
  return Finish(out);
}

Status StackMachine::StartLocal(std::span<const Frame> frames, bool whole, std::vector<StackId>& out) {
  out.clear();
  StackId s = whole ? kAccepted : kContext;
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) s = arena_.Intern(it->pos, it->utf8, s);
  if (s != kAccepted && s != kContext) Close(s, out);
  return Finish(out);
}

Status StackMachine::Advance(std::span<const StackId> in, uint8_t byte, std::vector<StackId>& out) {
  out.clear();
  for (StackId s : in) {
    if (s == kAccepted || s == kContext) continue;
    const Frame f = arena_.frame(s);
    const Element& el = g_.elements[f.pos];
    uint32_t cp = 0;
    const Utf8Partial p = StepUtf8(g_.classes[el.arg], f.utf8, byte, &cp);
    if (p == kNoMatch) continue;
    if (p != 0) {
      out.push_back(arena_.Intern(f.pos, p, f.parent));  // still inside a code point: top unchanged
    } else if (el.kind == ElementKind::kClassStar) {
      Close(arena_.Intern(f.pos, 0, f.parent), out);
    } else {
      Close(Next(f.pos, f.parent), out);
    }
  }
  return Finish(out);
}

Status StackMachine::AdvanceBytes(std::vector<StackId>& set, std::string_view bytes) {
  std::vector<StackId> next;
  for (char c : bytes) {
    TRELLIS_RETURN_IF_ERROR(Advance(set, static_cast<uint8_t>(c), next));
    set.swap(next);
    if (set.empty()) break;
  }
  return Status::Ok();
}

namespace {
// The stacks after `text`, or none (an error counts as none).
std::vector<StackId> ReadAll(const Grammar& g, std::string_view text) {
  StackArena arena;
  StackMachine m(g, arena);
  std::vector<StackId> set;
  if (!m.Start(set).ok() || !m.AdvanceBytes(set, text).ok()) return {};
  return set;
}
}  // namespace

bool Matches(const Grammar& g, std::string_view text) {
  const std::vector<StackId> set = ReadAll(g, text);
  return std::binary_search(set.begin(), set.end(), kAccepted);
}

bool IsPrefix(const Grammar& g, std::string_view text) { return !ReadAll(g, text).empty(); }

}  // namespace trellis::grammar
