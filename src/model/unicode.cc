#include "model/unicode.h"

#include <algorithm>
#include <array>

#include "model/unicode_data.h"

namespace trellis {
namespace {

using unicode_internal::CodepointRange;
using unicode_internal::kCodepointRangeCount;
using unicode_internal::kCodepointRanges;

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

bool IsCont(uint8_t b) { return (b & 0xC0) == 0x80; }

// ASCII is by far the most common input: answer it from a small table built once.
std::array<uint16_t, 128> BuildAsciiFlags() {
  std::array<uint16_t, 128> t{};
  size_t r = 0;
  for (uint32_t c = 0; c < 128; ++c) {
    while (r + 1 < kCodepointRangeCount && kCodepointRanges[r + 1].first <= c) ++r;
    t[c] = kCodepointRanges[r].flags;
  }
  return t;
}

// GPT-2's bytes_to_unicode(): bytes that are printable Latin-1 ('!'..'~', '¡'..'¬',
// '®'..'ÿ') keep their codepoint; the remaining 68 get 256, 257, ... in byte order.
constexpr bool IsPrintableLatin1(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}
constexpr std::array<uint16_t, 256> BuildByteToUnicode() {
  std::array<uint16_t, 256> t{};
  uint16_t next = 256;
  for (int b = 0; b < 256; ++b) t[b] = IsPrintableLatin1(b) ? static_cast<uint16_t>(b) : next++;
  return t;
}
constexpr std::array<uint16_t, 256> kByteToUnicode = BuildByteToUnicode();
constexpr uint32_t kByteAlphabetEnd = 256 + 68;  // one past the largest mapped codepoint
constexpr std::array<int16_t, kByteAlphabetEnd> BuildUnicodeToByte() {
  std::array<int16_t, kByteAlphabetEnd> t{};
  for (auto& v : t) v = -1;
  for (int b = 0; b < 256; ++b) t[kByteToUnicode[b]] = static_cast<int16_t>(b);
  return t;
}
constexpr std::array<int16_t, kByteAlphabetEnd> kUnicodeToByte = BuildUnicodeToByte();

}  // namespace

uint16_t CodepointFlags(uint32_t cpt) {
  static const std::array<uint16_t, 128> kAscii = BuildAsciiFlags();
  if (cpt < 128) return kAscii[cpt];
  if (cpt > kMaxCodepoint) return kUnicodeUndefined;
  const CodepointRange* begin = kCodepointRanges;
  const CodepointRange* end = kCodepointRanges + kCodepointRangeCount;
  // Last run whose first codepoint is <= cpt.
  const CodepointRange* it = std::upper_bound(
      begin, end, cpt, [](uint32_t c, const CodepointRange& r) { return c < r.first; });
  return (it - 1)->flags;
}

const char* UnicodeTableVersion() { return unicode_internal::kUnicodeVersion; }

uint32_t DecodeUtf8Lenient(std::string_view text, size_t* pos) {
  const size_t i = *pos;
  const size_t n = text.size();
  const auto at = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = at(i);
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  uint32_t cpt = 0;
  size_t len = 0;
  if ((b0 & 0x40) == 0) {
    len = 0;  // stray continuation byte
  } else if ((b0 & 0x20) == 0) {
    if (i + 1 < n && IsCont(at(i + 1))) {
      cpt = (uint32_t{b0} & 0x1F) << 6 | (at(i + 1) & 0x3Fu);
      len = 2;
    }
  } else if ((b0 & 0x10) == 0) {
    if (i + 2 < n && IsCont(at(i + 1)) && IsCont(at(i + 2))) {
      cpt = (uint32_t{b0} & 0x0F) << 12 | (at(i + 1) & 0x3Fu) << 6 | (at(i + 2) & 0x3Fu);
      len = 3;
    }
  } else if ((b0 & 0x08) == 0) {
    if (i + 3 < n && IsCont(at(i + 1)) && IsCont(at(i + 2)) && IsCont(at(i + 3))) {
      cpt = (uint32_t{b0} & 0x07) << 18 | (at(i + 1) & 0x3Fu) << 12 | (at(i + 2) & 0x3Fu) << 6 |
            (at(i + 3) & 0x3Fu);
      len = cpt <= kMaxCodepoint ? 4 : 0;
    }
  }
  if (len == 0) {
    *pos = i + 1;
    return kReplacementChar;
  }
  *pos = i + len;
  return cpt;
}

std::vector<uint32_t> CodepointsFromUtf8(std::string_view text) {
  std::vector<uint32_t> cpts;
  cpts.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) cpts.push_back(DecodeUtf8Lenient(text, &pos));
  return cpts;
}

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt < 0x80) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | ((cpt >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

int CheckUtf8Sequence(std::string_view bytes) {
  const auto at = [&](size_t k) { return static_cast<uint8_t>(bytes[k]); };
  const uint8_t b0 = at(0);
  if (b0 < 0x80) return 1;
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return -1;  // continuation byte, C0/C1 or F5..FF
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= bytes.size()) return 0;  // valid so far, incomplete
    const uint8_t b = at(k);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : IsCont(b);
    if (!ok) return -k;
  }
  return len;
}

uint32_t ByteToUnicode(uint8_t byte) { return kByteToUnicode[byte]; }

int UnicodeToByte(uint32_t cpt) { return cpt < kByteAlphabetEnd ? kUnicodeToByte[cpt] : -1; }

}  // namespace trellis
