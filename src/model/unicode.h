// Unicode helpers for the tokenizers: UTF-8 decoding that mirrors llama.cpp, codepoint
// category flags (letter / number / whitespace, ...), and GPT-2's byte <-> unicode mapping.
//
// Decoding is deliberately the same as llama.cpp's unicode_cpts_from_utf8 so that
// tokenization of malformed input matches it: a lead byte announces the sequence length,
// continuation bytes must be 10xxxxxx, overlong forms and surrogates are accepted as they
// decode, and any byte that does not start a complete sequence becomes U+FFFD and consumes
// exactly one byte. (Sequences decoding above U+10FFFF, which llama.cpp would throw on, are
// treated as invalid here.)
//
// Thread safety: stateless functions over constant tables; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trellis {

// Category bits per codepoint (values shared with tools/gen_unicode_data.py).
enum UnicodeFlag : uint16_t {
  kUnicodeUndefined = 0x0001,    // Cn: unassigned (also returned for cpt > 0x10FFFF)
  kUnicodeNumber = 0x0002,       // \p{N}
  kUnicodeLetter = 0x0004,       // \p{L}
  kUnicodeSeparator = 0x0008,    // \p{Z}
  kUnicodeMark = 0x0010,         // \p{M}
  kUnicodePunctuation = 0x0020,  // \p{P}
  kUnicodeSymbol = 0x0040,       // \p{S}
  kUnicodeControl = 0x0080,      // \p{C} other than Cn
  kUnicodeWhitespace = 0x0100,   // White_Space property, i.e. regex \s
};

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Flags of one codepoint; never 0.
uint16_t CodepointFlags(uint32_t cpt);

// The Unicode version the category table was generated from (e.g. "14.0.0").
const char* UnicodeTableVersion();

// Byte length a UTF-8 sequence starting with `lead` announces (1 for ASCII and for stray
// continuation bytes, 2/3/4 by the high bits). Not a validity check.
inline size_t Utf8LenFromLead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Decodes one codepoint at text[*pos] the llama.cpp way (see file comment) and advances *pos.
// REQUIRES: *pos < text.size().
uint32_t DecodeUtf8Lenient(std::string_view text, size_t* pos);

// All codepoints of `text`, decoded with DecodeUtf8Lenient.
std::vector<uint32_t> CodepointsFromUtf8(std::string_view text);

// Appends the UTF-8 encoding of `cpt` (REQUIRES: cpt <= 0x10FFFF).
void AppendUtf8(uint32_t cpt, std::string* out);

// Length of the well-formed UTF-8 sequence at the start of `bytes` per the Unicode standard
// (no overlongs, no surrogates, <= U+10FFFF):
//   > 0  a complete valid sequence of that many bytes;
//   0    the bytes so far are a valid but incomplete prefix (need more input);
//   < 0  invalid: the first -n bytes form a maximal ill-formed subpart to replace by U+FFFD.
// REQUIRES: !bytes.empty().
int CheckUtf8Sequence(std::string_view bytes);

// GPT-2 byte-level BPE alphabet: every byte maps to a printable codepoint (printable
// Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in byte order).
uint32_t ByteToUnicode(uint8_t byte);
// Inverse of ByteToUnicode; -1 if `cpt` is not in the alphabet.
int UnicodeToByte(uint32_t cpt);

}  // namespace trellis
