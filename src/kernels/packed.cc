#include "kernels/packed.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "util/status.h"

namespace trellis {
namespace {

constexpr int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// 64-byte lines per 32-element block.
int Lines(GgmlType type) { return type == GgmlType::kQ4_0 ? 4 : 8; }

}  // namespace

bool PackableType(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0 || type == GgmlType::kQ4_K || type == GgmlType::kQ5_K ||
         type == GgmlType::kQ6_K || type == GgmlType::kF16 || type == GgmlType::kBF16;
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
  if (type == GgmlType::kF16 || type == GgmlType::kBF16) return static_cast<size_t>(RoundUp(cols * 2 * kPackRows, 64));
  const int64_t nb = cols / 32;
  return static_cast<size_t>(RoundUp(nb * (64 * Lines(type) + 2 * kPackRows), 64));
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
      // Element k of the super-block: chunk k / 64, low nibble for the first 32 of it.
      auto nib = [&](int k) {
        const uint8_t byte = blk.qs[32 * (k / 64) + k % 32];
        return (k % 64) < 32 ? byte & 0xF : byte >> 4;
      };
      for (int j = 0; j < 8; ++j) {
        GetScaleMinK4(j, blk.scales, &sc[16 * j + r], &m[16 * j + r]);
        for (int i = 0; i < 4; ++i) {
          for (int q = 0; q < 4; ++q) {
            sb[256 * j + 64 * i + 4 * r + q] =
                static_cast<uint8_t>(nib(32 * j + 8 * i + q) | nib(32 * j + 8 * i + 4 + q) << 4);
          }
        }
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
        for (int q = 0; q < 4; ++q) {
          int high = 0;
          for (int i = 0; i < 4; ++i) {
            bl[64 * i + 4 * r + q] = static_cast<uint8_t>((e(8 * i + q) & 0xF) | (e(8 * i + 4 + q) & 0xF) << 4);
            high |= (e(8 * i + q) >> 4) << (2 * i) | (e(8 * i + 4 + q) >> 4) << (2 * i + 1);
          }
          bl[256 + 4 * r + q] = static_cast<uint8_t>(high);
        }
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
        for (int i = 0; i < 4; ++i) {
          for (int qq = 0; qq < 4; ++qq) {
            bl[64 * i + 4 * r + qq] = static_cast<uint8_t>((q(8 * i + qq) & 0xF) | (q(8 * i + 4 + qq) & 0xF) << 4);
          }
        }
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
  if (w.type == GgmlType::kQ4_K || w.type == GgmlType::kQ5_K || w.type == GgmlType::kQ6_K) {
    const size_t group_bytes = PackedGroupBytes(w.type, w.cols);
    for (int64_t g = g_begin; g < g_end; ++g) {
      uint8_t* out = dst + static_cast<size_t>(g) * group_bytes;
      std::memset(out, 0, group_bytes);
      if (w.type == GgmlType::kQ4_K) {
        PackGroupQ4_K(w, g, out);
      } else if (w.type == GgmlType::kQ5_K) {
        PackGroupQ5_K(w, g, out);
      } else {
        PackGroupQ6_K(w, g, out);
      }
    }
    return;
  }
  const int64_t nb = w.cols / 32;
  const int lines = Lines(w.type);
  const size_t group_bytes = PackedGroupBytes(w.type, w.cols);
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int64_t g = g_begin; g < g_end; ++g) {
    uint8_t* out = dst + static_cast<size_t>(g) * group_bytes;
    std::memset(out, 0, group_bytes);
    uint16_t* scales = reinterpret_cast<uint16_t*>(out + nb * 64 * lines);
    for (int r = 0; r < kPackRows; ++r) {
      const int64_t row = g * kPackRows + r;
      if (row >= w.rows) break;
      const uint8_t* rp = src + row * w.row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* qs = out + b * 64 * lines;
        if (w.type == GgmlType::kQ4_0) {
          const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(rp) + b;
          scales[16 * b + r] = blk->d;
          auto nib = [&](int k) { return k < 16 ? blk->qs[k] & 0xF : blk->qs[k - 16] >> 4; };
          for (int i = 0; i < 4; ++i) {
            for (int q = 0; q < 4; ++q) {
              qs[64 * i + 4 * r + q] = static_cast<uint8_t>(nib(8 * i + q) | nib(8 * i + 4 + q) << 4);
            }
          }
        } else {
          const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(rp) + b;
          scales[16 * b + r] = blk->d;
          for (int j = 0; j < 8; ++j) {
            for (int q = 0; q < 4; ++q) {
              qs[64 * j + 4 * r + q] = static_cast<uint8_t>(blk->qs[4 * j + q]) ^ 0x80;
            }
          }
        }
      }
    }
  }
}

}  // namespace trellis
