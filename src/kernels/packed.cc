#include "kernels/packed.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu_features.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "util/status.h"

namespace trellis {
namespace {

constexpr int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The 32-element block types (Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL): f16 arrays per block (d;
// Q5_1 also m).
int ScaleArrays(GgmlType type) { return type == GgmlType::kQ5_1 ? 2 : 1; }

// Row r's 32 elements e(0..31) of a block as its 4 nibble lines at out: line i byte 4r+q
// holds the low nibbles of e(8i+q) and e(8i+4+q) (packed.h).
template <typename E>
void PackNibbleLines(E e, int r, uint8_t* out) {
  for (int i = 0; i < 4; ++i) {
    for (int q = 0; q < 4; ++q) {
      out[64 * i + 4 * r + q] = static_cast<uint8_t>((e(8 * i + q) & 0xF) | (e(8 * i + 4 + q) & 0xF) << 4);
    }
  }
}

// The 5th bits of row r's elements e(0..31) as the line at out: byte 4r+q holds those of
// e(8i+q) at bit 2i and e(8i+4+q) at bit 2i+1, i = 0..3 (packed.h).
template <typename E>
void PackFifthBitLine(E e, int r, uint8_t* out) {
  for (int q = 0; q < 4; ++q) {
    int high = 0;
    for (int i = 0; i < 4; ++i) high |= (e(8 * i + q) >> 4 & 1) << (2 * i) | (e(8 * i + 4 + q) >> 4 & 1) << (2 * i + 1);
    out[4 * r + q] = static_cast<uint8_t>(high);
  }
}

}  // namespace

bool PackableType(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kIQ4_NL:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kF16:
    case GgmlType::kBF16: return true;
    default: return false;
  }
}

bool PackingUseful(const WeightMatrix& w) {
  if (!PackableType(w.type) || w.cols % 32 != 0) return false;
  return matmul_internal::GetPackedKernel(BestKernelIsa(), w.type).fn != nullptr;
}

size_t PackedGroupBytes(GgmlType type, int64_t cols) {
  if (!PackableType(type)) return 0;
  if (type == GgmlType::kQ4_K) return static_cast<size_t>(cols / kQkK * kPackedQ4KSuperBytes);
  if (type == GgmlType::kQ5_K) return static_cast<size_t>(cols / kQkK * kPackedQ5KSuperBytes);
  if (type == GgmlType::kQ6_K) return static_cast<size_t>(cols / kQkK * kPackedQ6KSuperBytes);
  if (type == GgmlType::kIQ4_XS) return static_cast<size_t>(cols / kQkK * kPackedIQ4XSSuperBytes);
  if (type == GgmlType::kQ2_K) return static_cast<size_t>(cols / kQkK * kPackedQ2KSuperBytes);
  if (type == GgmlType::kQ3_K) return static_cast<size_t>(cols / kQkK * kPackedQ3KSuperBytes);
  if (type == GgmlType::kF16 || type == GgmlType::kBF16) return static_cast<size_t>(RoundUp(cols * 2 * kPackRows, 64));
  const int64_t nb = cols / 32;
  return static_cast<size_t>(RoundUp(nb * (64 * PackedLines(type) + 2 * kPackRows * ScaleArrays(type)), 64));
}

size_t PackedBytes(const WeightMatrix& w) {
  const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
  return PackedGroupBytes(w.type, w.cols) * static_cast<size_t>(groups);
}

namespace {

// One 16-row group of a Q4_K matrix (layout in packed.h).
void PackGroupQ4_K(const WeightMatrix& w, int64_t g, uint8_t* out) {
  const int64_t nsb = w.cols / kQkK;
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int r = 0; r < kPackRows; ++r) {
    const int64_t row = g * kPackRows + r;
    if (row >= w.rows) break;
    const BlockQ4_K* blocks = reinterpret_cast<const BlockQ4_K*>(src + row * w.row_bytes);
    for (int64_t s = 0; s < nsb; ++s) {
      const BlockQ4_K& blk = blocks[s];
      uint8_t* sb = out + s * kPackedQ4KSuperBytes;
      uint16_t* d = reinterpret_cast<uint16_t*>(sb + 2048);
      uint16_t* dmin = d + 16;
      uint8_t* sc = sb + 2048 + 64;
      uint8_t* m = sc + 128;
      d[r] = blk.d;
      dmin[r] = blk.dmin;
      for (int j = 0; j < 8; ++j) {
        GetScaleMinK4(j, blk.scales, &sc[16 * j + r], &m[16 * j + r]);
        // Element k of sub-block j: chunk j / 2 of 64, low nibbles for even j.
        PackNibbleLines([&](int k) { const uint8_t byte = blk.qs[32 * (j / 2) + k]; return j % 2 == 0 ? byte & 0xF : byte >> 4; },
                        r, sb + 256 * j);
      }
    }
  }
}

// One 16-row group of a Q5_K matrix (layout in packed.h).
void PackGroupQ5_K(const WeightMatrix& w, int64_t g, uint8_t* out) {
  const int64_t nsb = w.cols / kQkK;
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int r = 0; r < kPackRows; ++r) {
    const int64_t row = g * kPackRows + r;
    if (row >= w.rows) break;
    const BlockQ5_K* blocks = reinterpret_cast<const BlockQ5_K*>(src + row * w.row_bytes);
    for (int64_t s = 0; s < nsb; ++s) {
      const BlockQ5_K& blk = blocks[s];
      uint8_t* sb = out + s * kPackedQ5KSuperBytes;
      uint16_t* d = reinterpret_cast<uint16_t*>(sb + 8 * 320);
      uint8_t* sc = sb + 8 * 320 + 64;
      uint8_t* m = sc + 128;
      d[r] = blk.d;
      d[16 + r] = blk.dmin;
      for (int j = 0; j < 8; ++j) {
        GetScaleMinK4(j, blk.scales, &sc[16 * j + r], &m[16 * j + r]);
        uint8_t* bl = sb + 320 * j;
        auto e = [&](int k) { return Q5KElement(blk, 32 * j + k); };
        PackNibbleLines(e, r, bl);
        PackFifthBitLine(e, r, bl + 256);
      }
    }
  }
}

// Q6_K element k (0..255) of a block as 0..63 (value q - 32), and its group scale.
int Q6Element(const BlockQ6_K& blk, int k) {
  const int h = k / 128, e = k % 128, quarter = e / 32, l = e % 32;
  const uint8_t ql = blk.ql[64 * h + 32 * (quarter & 1) + l];
  const int low = quarter < 2 ? ql & 0xF : ql >> 4;
  const int high = (blk.qh[32 * h + l] >> (2 * quarter)) & 3;
  return low | high << 4;
}

// One 16-row group of a Q6_K matrix (layout in packed.h).
void PackGroupQ6_K(const WeightMatrix& w, int64_t g, uint8_t* out) {
  const int64_t nsb = w.cols / kQkK;
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int r = 0; r < kPackRows; ++r) {
    const int64_t row = g * kPackRows + r;
    if (row >= w.rows) break;
    const BlockQ6_K* blocks = reinterpret_cast<const BlockQ6_K*>(src + row * w.row_bytes);
    for (int64_t s = 0; s < nsb; ++s) {
      const BlockQ6_K& blk = blocks[s];
      uint8_t* sb = out + s * kPackedQ6KSuperBytes;
      int8_t* sc = reinterpret_cast<int8_t*>(sb + 8 * 384);
      uint16_t* d = reinterpret_cast<uint16_t*>(sb + 8 * 384 + 256);
      d[r] = blk.d;
      for (int grp = 0; grp < 16; ++grp) sc[16 * grp + r] = blk.scales[grp];
      for (int j = 0; j < 8; ++j) {
        uint8_t* bl = sb + 384 * j;
        auto q = [&](int e) { return Q6Element(blk, 32 * j + e); };
        PackNibbleLines(q, r, bl);
        for (int m = 0; m < 2; ++m) {
          for (int qq = 0; qq < 4; ++qq) {
            int bits = 0;
            for (int f = 0; f < 4; ++f) bits |= (q(16 * m + 4 * f + qq) >> 4) << (2 * f);
            bl[256 + 64 * m + 4 * r + qq] = static_cast<uint8_t>(bits);
          }
        }
      }
    }
  }
}

// One 16-row group of an IQ4_XS matrix (layout in packed.h).
void PackGroupIQ4_XS(const WeightMatrix& w, int64_t g, uint8_t* out) {
  const int64_t nsb = w.cols / kQkK;
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int r = 0; r < kPackRows; ++r) {
    const int64_t row = g * kPackRows + r;
    if (row >= w.rows) break;
    const BlockIQ4_XS* blocks = reinterpret_cast<const BlockIQ4_XS*>(src + row * w.row_bytes);
    for (int64_t s = 0; s < nsb; ++s) {
      const BlockIQ4_XS& blk = blocks[s];
      uint8_t* sb = out + s * kPackedIQ4XSSuperBytes;
      reinterpret_cast<uint16_t*>(sb + 2048)[r] = blk.d;
      int8_t* sc = reinterpret_cast<int8_t*>(sb + 2048 + 32);
      for (int j = 0; j < 8; ++j) {
        sc[16 * j + r] = static_cast<int8_t>(IQ4XsScale(blk, j));
        const uint8_t* q = blk.qs + 16 * j;
        PackNibbleLines([&](int k) { return k < 16 ? q[k] & 0xF : q[k - 16] >> 4; }, r, sb + 256 * j);
      }
    }
  }
}

// Row r's 32 elements e(0..31) of a block, low 2 bits, as the 2 crumb lines at out: line m
// byte 4r+q holds e(16m+4f+q) at bits 2f, f = 0..3 (packed.h).
template <typename E>
void PackCrumbLines(E e, int r, uint8_t* out) {
  for (int m = 0; m < 2; ++m) {
    for (int q = 0; q < 4; ++q) {
      int bits = 0;
      for (int f = 0; f < 4; ++f) bits |= (e(16 * m + 4 * f + q) & 3) << (2 * f);
      out[64 * m + 4 * r + q] = static_cast<uint8_t>(bits);
    }
  }
}

// One 16-row group of a Q2_K or Q3_K matrix (layouts in packed.h).
template <bool kQ3>
void PackGroupLowK(const WeightMatrix& w, int64_t g, uint8_t* out) {
  const int64_t nsb = w.cols / kQkK;
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  using Block = std::conditional_t<kQ3, BlockQ3_K, BlockQ2_K>;
  constexpr int64_t kBlock = kQ3 ? 192 : 128, kSuper = kQ3 ? kPackedQ3KSuperBytes : kPackedQ2KSuperBytes;
  for (int r = 0; r < kPackRows; ++r) {
    const int64_t row = g * kPackRows + r;
    if (row >= w.rows) break;
    const Block* blocks = reinterpret_cast<const Block*>(src + row * w.row_bytes);
    for (int64_t s = 0; s < nsb; ++s) {
      const Block& blk = blocks[s];
      uint8_t* sb = out + s * kSuper;
      uint16_t* d = reinterpret_cast<uint16_t*>(sb + 8 * kBlock + 256);
      d[r] = blk.d;
      for (int grp = 0; grp < 16; ++grp) {
        if constexpr (kQ3) {
          reinterpret_cast<int8_t*>(sb + 8 * kBlock)[16 * grp + r] = static_cast<int8_t>(Q3KScale(blk, grp));
        } else {
          sb[8 * kBlock + 16 * grp + r] = blk.scales[grp];
        }
      }
      if constexpr (!kQ3) d[16 + r] = blk.dmin;
      for (int j = 0; j < 8; ++j) {
        uint8_t* bl = sb + kBlock * j;
        if constexpr (kQ3) {
          auto e = [&](int k) { return Q3KElement(blk, 32 * j + k) + 4; };  // 0..7
          PackCrumbLines(e, r, bl);
          for (int q = 0; q < 4; ++q) {
            int bits = 0;
            for (int f = 0; f < 8; ++f) bits |= (e(4 * f + q) >> 2 & 1) << f;
            bl[128 + 4 * r + q] = static_cast<uint8_t>(bits);
          }
        } else {
          PackCrumbLines([&](int k) { return Q2KElement(blk, 32 * j + k); }, r, bl);
        }
      }
    }
  }
}

}  // namespace

void PackWeights(const WeightMatrix& w, int64_t g_begin, int64_t g_end, uint8_t* dst) {
  TRELLIS_CHECK(PackableType(w.type) && w.cols % 32 == 0);
  if (w.type == GgmlType::kF16 || w.type == GgmlType::kBF16) {
    // F16: element (r, k) at 16 k + r. BF16: column pairs, (r, k) at 32 (k / 2) + 2 r + k % 2.
    const size_t group_bytes = PackedGroupBytes(w.type, w.cols);
    const uint8_t* src = static_cast<const uint8_t*>(w.data);
    for (int64_t g = g_begin; g < g_end; ++g) {
      uint8_t* out = dst + static_cast<size_t>(g) * group_bytes;
      std::memset(out, 0, group_bytes);
      // Column-major within the group: read the 16 rows side by side and write the
      // output in order (a write stride of 32 bytes per element was ~6x slower).
      uint16_t* o = reinterpret_cast<uint16_t*>(out);
      const int n = static_cast<int>(std::min<int64_t>(kPackRows, w.rows - g * kPackRows));
      const uint16_t* rows[kPackRows];
      for (int r = 0; r < n; ++r) rows[r] = reinterpret_cast<const uint16_t*>(src + (g * kPackRows + r) * w.row_bytes);
      if (w.type == GgmlType::kF16) {
        for (int64_t k = 0; k < w.cols; ++k) {
          for (int r = 0; r < n; ++r) o[16 * k + r] = rows[r][k];
        }
      } else {
        for (int64_t k = 0; k < w.cols; k += 2) {
          for (int r = 0; r < n; ++r) {
            o[16 * k + 2 * r] = rows[r][k];
            o[16 * k + 2 * r + 1] = rows[r][k + 1];
          }
        }
      }
    }
    return;
  }
  if (w.type == GgmlType::kQ4_K || w.type == GgmlType::kQ5_K || w.type == GgmlType::kQ6_K ||
      w.type == GgmlType::kIQ4_XS || w.type == GgmlType::kQ2_K || w.type == GgmlType::kQ3_K) {
    const size_t group_bytes = PackedGroupBytes(w.type, w.cols);
    for (int64_t g = g_begin; g < g_end; ++g) {
      uint8_t* out = dst + static_cast<size_t>(g) * group_bytes;
      std::memset(out, 0, group_bytes);
      if (w.type == GgmlType::kQ4_K) {
        PackGroupQ4_K(w, g, out);
      } else if (w.type == GgmlType::kQ5_K) {
        PackGroupQ5_K(w, g, out);
      } else if (w.type == GgmlType::kIQ4_XS) {
        PackGroupIQ4_XS(w, g, out);
      } else if (w.type == GgmlType::kQ2_K) {
        PackGroupLowK<false>(w, g, out);
      } else if (w.type == GgmlType::kQ3_K) {
        PackGroupLowK<true>(w, g, out);
      } else {
        PackGroupQ6_K(w, g, out);
      }
    }
    return;
  }
  const int64_t nb = w.cols / 32;
  const int lines = PackedLines(w.type);
  const size_t group_bytes = PackedGroupBytes(w.type, w.cols);
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int64_t g = g_begin; g < g_end; ++g) {
    uint8_t* out = dst + static_cast<size_t>(g) * group_bytes;
    std::memset(out, 0, group_bytes);
    uint16_t* scales = reinterpret_cast<uint16_t*>(out + nb * 64 * lines);
    uint16_t* mins = scales + 16 * nb;  // Q5_1
    for (int r = 0; r < kPackRows; ++r) {
      const int64_t row = g * kPackRows + r;
      if (row >= w.rows) break;
      const uint8_t* rp = src + row * w.row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* qs = out + b * 64 * lines;
        switch (w.type) {
          case GgmlType::kQ4_0: {
            const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(rp)[b];
            scales[16 * b + r] = blk.d;
            PackNibbleLines([&](int k) { return k < 16 ? blk.qs[k] & 0xF : blk.qs[k - 16] >> 4; }, r, qs);
            break;
          }
          case GgmlType::kIQ4_NL: {  // the grid indices
            const BlockIQ4_NL& blk = reinterpret_cast<const BlockIQ4_NL*>(rp)[b];
            scales[16 * b + r] = blk.d;
            PackNibbleLines([&](int k) { return k < 16 ? blk.qs[k] & 0xF : blk.qs[k - 16] >> 4; }, r, qs);
            break;
          }
          case GgmlType::kQ5_0: {
            const BlockQ5_0& blk = reinterpret_cast<const BlockQ5_0*>(rp)[b];
            scales[16 * b + r] = blk.d;
            auto e = [&](int k) { return Q5Element(blk, k); };
            PackNibbleLines(e, r, qs);
            PackFifthBitLine(e, r, qs + 256);
            break;
          }
          case GgmlType::kQ5_1: {
            const BlockQ5_1& blk = reinterpret_cast<const BlockQ5_1*>(rp)[b];
            scales[16 * b + r] = blk.d;
            mins[16 * b + r] = blk.m;
            auto e = [&](int k) { return Q5Element(blk, k); };
            PackNibbleLines(e, r, qs);
            PackFifthBitLine(e, r, qs + 256);
            break;
          }
          default: {
            const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(rp)[b];
            scales[16 * b + r] = blk.d;
            for (int j = 0; j < 8; ++j) {
              for (int q = 0; q < 4; ++q) qs[64 * j + 4 * r + q] = static_cast<uint8_t>(blk.qs[4 * j + q]) ^ 0x80;
            }
          }
        }
      }
    }
  }
}

}  // namespace trellis
