// Generated Unicode property table (see tools/gen_unicode_data.py and unicode_data.cc).
//
// Internal to src/model: use the accessors in model/unicode.h instead.
//
// Thread safety: immutable constant data.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trellis::unicode_internal {

// One run of codepoints sharing the same UnicodeFlag bits: [first, next run's first).
struct CodepointRange {
  uint32_t first;
  uint16_t flags;
};

// Sorted by `first`; kCodepointRanges[0].first == 0; the last run extends to 0x10FFFF.
extern const CodepointRange kCodepointRanges[];
extern const size_t kCodepointRangeCount;
// Unicode version of the Python unicodedata module the table was generated from.
extern const char kUnicodeVersion[];

}  // namespace trellis::unicode_internal
