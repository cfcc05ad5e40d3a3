// KV layout, KvWrite, the PagedAttention driver (work split + dispatch), the scalar tile
// kernel and the dense reference.
#include "kernels/attention.h"

#include "kernels/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_internal.h"
#include "kernels/quant.h"
#include "util/fp16.h"
#include "util/status.h"

namespace trellis {

const char* KvTypeName(KvType t) {
  switch (t) {
    case KvType::kF16: return "f16";
    case KvType::kQ8_0: return "q8_0";
    case KvType::kQ4_0: return "q4_0";
  }
  return "?";
}

bool ParseKvType(std::string_view name, KvType* t) {
  for (KvType k : {KvType::kF16, KvType::kQ8_0, KvType::kQ4_0}) {
    if (name == KvTypeName(k)) {
      *t = k;
      return true;
    }
  }
  return false;
}

size_t KvRowBytes(KvType t, int head_dim) {
  const size_t hd = static_cast<size_t>(head_dim);
  switch (t) {
    case KvType::kF16: return hd * 2;
    case KvType::kQ8_0: return hd / 32 * sizeof(BlockQ8_0);
    case KvType::kQ4_0: return hd / 32 * sizeof(BlockQ4_0);
  }
  return 0;
}

size_t KvLayout::LayerBytes() const {
  const size_t raw = static_cast<size_t>(n_head_kv) * (TileBytes(0) + TileBytes(1));
  return (raw + 63) / 64 * 64;
}

size_t KvLayout::BlockBytes() const { return static_cast<size_t>(n_layer) * LayerBytes(); }

size_t KvLayout::ByteOffset(int layer, int kv, int head, int slot) const {
  return static_cast<size_t>(layer) * LayerBytes() + (kv == 0 ? 0 : static_cast<size_t>(n_head_kv) * TileBytes(0)) +
         static_cast<size_t>(head) * TileBytes(kv) + static_cast<size_t>(slot) * RowBytes(kv);
}

int KvRotationK(const KvLayout& l) {
  if (l.k_type == KvType::kF16 || l.head_dim % 64 != 0) return 0;
  int n = 64;
  while (l.head_dim % (2 * n) == 0) n *= 2;
  return n;
}

int KvRotationV(const KvLayout& l) { return l.v_type == KvType::kF16 || l.head_dim % 64 != 0 ? 0 : 64; }

void HadamardRows(float* x, int64_t stride, int64_t n_rows, int64_t width, int n) {
  TRELLIS_CHECK(n > 0 && (n & (n - 1)) == 0 && width % n == 0);
  // As llama.cpp multiplies by its matrix of +-1/sqrt(n) in f32: the butterflies
  // (exact up to rounding), then that factor.
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t c0 = 0; c0 < width; c0 += n) {
      float* v = x + r * stride + c0;
      for (int h = 1; h < n; h *= 2) {
        for (int i = 0; i < n; i += 2 * h) {
          for (int j = i; j < i + h; ++j) {
            const float a = v[j], b = v[j + h];
            v[j] = a + b;
            v[j + h] = a - b;
          }
        }
      }
      for (int j = 0; j < n; ++j) v[j] *= norm;
    }
  }
}

namespace {

uint8_t* BlockPtr(const PagedKv& kv, int32_t block) {
  return kv.base + static_cast<size_t>(block) * kv.layout.BlockBytes();
}

void F32ToF16Scalar(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
}

// One row of n floats into type t at dst; f16 by `to_f16`, the quantized types by the
// reference quantizers llama.cpp's cache uses (quantize_row_q8_0 / q4_0).
template <typename ToF16>
void WriteRow(KvType t, const float* x, uint8_t* dst, int n, ToF16 to_f16) {
  switch (t) {
    case KvType::kF16: to_f16(x, reinterpret_cast<uint16_t*>(dst), n); break;
    case KvType::kQ8_0: QuantizeRowQ8_0(x, reinterpret_cast<BlockQ8_0*>(dst), n); break;
    case KvType::kQ4_0: TRELLIS_CHECK(QuantizeRow(GgmlType::kQ4_0, x, dst, n).ok()); break;
  }
}

template <typename ToF16>
void KvWriteWith(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs, const float* k,
                 int64_t k_stride, const float* v, int64_t v_stride, ToF16 to_f16) {
  const KvLayout& L = kv.layout;
  for (const AttnSeq& s : seqs) {
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      const int32_t p = s.pos0 + i;
      uint8_t* blk = BlockPtr(kv, s.block_table[p / L.block_size]);
      const int slot = p % L.block_size;
      const int64_t row = s.q_row0 + i;
      for (int h = 0; h < L.n_head_kv; ++h) {
        const int64_t col = static_cast<int64_t>(h) * L.head_dim;
        WriteRow(L.k_type, k + row * k_stride + col, blk + L.ByteOffset(layer, 0, h, slot), L.head_dim, to_f16);
        WriteRow(L.v_type, v + row * v_stride + col, blk + L.ByteOffset(layer, 1, h, slot), L.head_dim, to_f16);
      }
    }
  }
}

// n rows of K or V (type t, row_bytes apart) -> f32 [n][head_dim].
void LoadRowsScalar(KvType t, const uint8_t* src, size_t row_bytes, int n, int hd, float* dst) {
  for (int r = 0; r < n; ++r, src += row_bytes, dst += hd) {
    if (t == KvType::kF16) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
      for (int d = 0; d < hd; ++d) dst[d] = Fp16ToFp32(h[d]);
    } else {
      internal::DequantKvRow(t, src, dst, hd);
    }
  }
}

}  // namespace

void KvWriteRef(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride) {
  KvWriteWith(kv, layer, seqs, k, k_stride, v, v_stride, F32ToF16Scalar);
}

void KvWrite(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs, const float* k,
             int64_t k_stride, const float* v, int64_t v_stride) {
#if TRELLIS_X86
  if (internal::BestSimdLevel() != internal::SimdLevel::kScalar) {
    KvWriteWith(kv, layer, seqs, k, k_stride, v, v_stride, internal::F32ToF16Avx2);
    return;
  }
#endif
  KvWriteWith(kv, layer, seqs, k, k_stride, v, v_stride, F32ToF16Scalar);
}

size_t AttentionScratchFloats(int n_threads, int head_dim, int block_size) {
  return static_cast<size_t>(n_threads) *
         internal::AttentionScratchFloatsPerThread(head_dim, block_size);
}

namespace internal {

void AttnTileScalar(const AttnTile& t) {
  const int hd = t.head_dim, bs = t.block_size;
  const int nq = t.n_rows * t.n_heads;
  float* kt = t.scratch;                 // [bs][hd]
  float* vt = kt + bs * hd;              // [bs][hd]
  const int max_q = AttnMaxQueries(hd);
  float* qs = vt + bs * hd;      // [max_q][hd]
  float* s = qs + max_q * hd;    // [max_q][bs]
  float* acc = s + max_q * bs;   // [max_q][hd]
  float* m = acc + max_q * hd;   // [max_q]
  float* l = m + max_q;          // [max_q]
  float q8[kKvMaxQuantizedHeadDim];
  for (int qi = 0; qi < nq; ++qi) {
    const float* src = t.q + (qi / t.n_heads) * t.q_stride + (qi % t.n_heads) * hd;
    if (t.k_type != KvType::kF16) src = QueryThroughQ8_0(src, hd, q8);
    for (int d = 0; d < hd; ++d) {
      qs[qi * hd + d] = src[d] * t.scale;
      acc[qi * hd + d] = 0.0f;
    }
    m[qi] = -std::numeric_limits<float>::infinity();
    l[qi] = 0.0f;
  }
  const int32_t kv_end = t.pos_first + t.n_rows;  // exclusive, of the last row
  for (int32_t p0 = AttnTileFirstPos(t) / bs * bs; p0 < kv_end; p0 += bs) {
    const uint8_t* blk = t.base + static_cast<size_t>(t.block_table[p0 / bs]) * t.block_bytes;
    const int nvalid = std::min(bs, kv_end - p0);
    LoadRowsScalar(t.k_type, blk + t.k_off, t.k_row, nvalid, hd, kt);
    LoadRowsScalar(t.v_type, blk + t.v_off, t.v_row, nvalid, hd, vt);
    for (int qi = 0; qi < nq; ++qi) {
      const int n = std::min(bs, t.pos_first + qi / t.n_heads + 1 - p0);
      const int lo = AttnRowFirstSlot(t, qi / t.n_heads, p0);
      if (n <= lo) continue;
      float* sq = s + qi * bs;
      float mb = -std::numeric_limits<float>::infinity();
      for (int j = lo; j < n; ++j) {
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot += qs[qi * hd + d] * kt[j * hd + d];
        if (t.softcap > 0) dot = t.softcap * std::tanh(dot / t.softcap);
        sq[j] = dot;
        mb = std::max(mb, dot);
      }
      const float m_new = std::max(m[qi], mb);
      const float corr = std::exp(m[qi] - m_new);
      float sum = 0.0f;
      for (int j = lo; j < n; ++j) {
        sq[j] = std::exp(sq[j] - m_new);
        sum += sq[j];
      }
      l[qi] = l[qi] * corr + sum;
      m[qi] = m_new;
      float* a = acc + qi * hd;
      for (int d = 0; d < hd; ++d) a[d] *= corr;
      for (int j = lo; j < n; ++j) {
        for (int d = 0; d < hd; ++d) a[d] += sq[j] * vt[j * hd + d];
      }
    }
  }
  for (int qi = 0; qi < nq; ++qi) {
    float* dst = t.out + (qi / t.n_heads) * t.out_stride + (qi % t.n_heads) * hd;
    const float inv = 1.0f / l[qi];
    for (int d = 0; d < hd; ++d) dst[d] = acc[qi * hd + d] * inv;
  }
}

void PagedAttentionAt(SimdLevel level, const PagedKv& kv, int layer,
                      std::span<const AttnSeq> seqs, const float* q, int64_t q_stride,
                      int n_head, float scale, float* out, int64_t out_stride,
                      ThreadPool& pool, float* scratch, const AttnOptions& opt) {
  const KvLayout& L = kv.layout;
  TRELLIS_CHECK(L.n_head_kv > 0 && n_head % L.n_head_kv == 0);
  const int hd = L.head_dim, bs = L.block_size;
  const bool simd_shape = hd % 8 == 0 && bs % 8 == 0;
  void (*kernel)(const AttnTile&) = AttnTileScalar;
#if TRELLIS_X86
  if (simd_shape && level == SimdLevel::kAvx512) kernel = AttnTileAvx512;
  if (simd_shape && level == SimdLevel::kAvx2) kernel = AttnTileAvx2;
#elif TRELLIS_ARM64
  if (simd_shape && level == SimdLevel::kNeon) kernel = AttnTileNeon;
#else
  (void)simd_shape;
#endif

  // Item = (sequence, row tile, KV head, chunk of the group's query heads).
  const int n_rep = n_head / L.n_head_kv;
  const int max_q = AttnMaxQueries(hd);
  const int heads_per_item = std::min(n_rep, max_q);
  const int n_chunks = (n_rep + heads_per_item - 1) / heads_per_item;
  const int64_t items_per_tile = static_cast<int64_t>(L.n_head_kv) * n_chunks;
  auto count_items = [&](int rows_per_tile) {
    int64_t n = 0;
    for (const AttnSeq& s : seqs) n += (s.n_tokens + rows_per_tile - 1) / rows_per_tile * items_per_tile;
    return n;
  };
  // As many rows per item as fit, but at least 4 items per thread (short prefills on many
  // threads) while a tile can still be split.
  int rows_per_tile = max_q / heads_per_item;
  int64_t n_items = count_items(rows_per_tile);
  while (rows_per_tile > 1 && n_items < 4 * static_cast<int64_t>(pool.size())) {
    rows_per_tile = (rows_per_tile + 1) / 2;
    n_items = count_items(rows_per_tile);
  }
  const size_t scratch_per_thread = AttentionScratchFloatsPerThread(hd, bs);
  const size_t block_bytes = L.BlockBytes();

  std::atomic<int64_t> next{0};
  pool.Run([&](int ith, int /*nth*/) {
    float* my_scratch = scratch + static_cast<size_t>(ith) * scratch_per_thread;
    size_t si = 0;         // sequence of the last item (items are taken in increasing order)
    int64_t seq_first = 0;  // index of that sequence's first item
    for (;;) {
      const int64_t item = next.fetch_add(1, std::memory_order_relaxed);
      if (item >= n_items) break;
      int64_t n_tiles = 0;
      for (;; ++si) {
        n_tiles = (seqs[si].n_tokens + rows_per_tile - 1) / rows_per_tile;
        if (item < seq_first + n_tiles * items_per_tile) break;
        seq_first += n_tiles * items_per_tile;
      }
      const AttnSeq& s = seqs[si];
      const int64_t local = item - seq_first;
      // Later (heavier) row tiles first.
      const int64_t tile = n_tiles - 1 - local / items_per_tile;
      const int kv_head = static_cast<int>(local % items_per_tile) / n_chunks;
      const int chunk = static_cast<int>(local % items_per_tile) % n_chunks;
      const int32_t r0 = static_cast<int32_t>(tile) * rows_per_tile;
      const int head0 = kv_head * n_rep + chunk * heads_per_item;
      AttnTile t;
      t.base = kv.base;
      t.block_bytes = block_bytes;
      t.k_off = L.ByteOffset(layer, 0, kv_head, 0);
      t.v_off = L.ByteOffset(layer, 1, kv_head, 0);
      t.k_type = L.k_type;
      t.v_type = L.v_type;
      t.k_row = L.RowBytes(0);
      t.v_row = L.RowBytes(1);
      t.head_dim = hd;
      t.block_size = bs;
      t.block_table = s.block_table;
      t.pos_first = s.pos0 + r0;
      t.n_rows = std::min(rows_per_tile, s.n_tokens - r0);
      t.n_heads = std::min(heads_per_item, n_rep - chunk * heads_per_item);
      t.q = q + (s.q_row0 + r0) * q_stride + static_cast<int64_t>(head0) * hd;
      t.q_stride = q_stride;
      t.out = out + (s.q_row0 + r0) * out_stride + static_cast<int64_t>(head0) * hd;
      t.out_stride = out_stride;
      t.scale = scale;
      t.softcap = opt.softcap;
      t.window = opt.window;
      t.scratch = my_scratch;
      kernel(t);
    }
  });
}

}  // namespace internal

void PagedAttention(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs,
                    const float* q, int64_t q_stride, int n_head, float scale, float* out,
                    int64_t out_stride, ThreadPool& pool, float* scratch, const AttnOptions& opt) {
  internal::PagedAttentionAt(internal::BestSimdLevel(), kv, layer, seqs, q, q_stride, n_head,
                             scale, out, out_stride, pool, scratch, opt);
}

namespace {

void DequantRef(KvType t, const uint8_t* src, float* dst, int n) {
  const GgmlType g = t == KvType::kF16 ? GgmlType::kF16 : t == KvType::kQ8_0 ? GgmlType::kQ8_0 : GgmlType::kQ4_0;
  TRELLIS_CHECK(DequantizeRow(g, src, dst, n).ok());
}

}  // namespace

void PagedAttentionRef(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs,
                       const float* q, int64_t q_stride, int n_head, float scale, float* out,
                       int64_t out_stride, const AttnOptions& opt) {
  const KvLayout& L = kv.layout;
  TRELLIS_CHECK(L.n_head_kv > 0 && n_head % L.n_head_kv == 0);
  const int hd = L.head_dim, n_rep = n_head / L.n_head_kv;
  std::vector<float> kf, vf, p;  // [n_kv][hd], [n_kv][hd], [n_kv]
  for (const AttnSeq& s : seqs) {
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      const int32_t n_kv = s.pos0 + i + 1;
      const int64_t row = s.q_row0 + i;
      for (int h = 0; h < n_head; ++h) {
        const int kvh = h / n_rep;
        kf.resize(static_cast<size_t>(n_kv) * hd);
        vf.resize(static_cast<size_t>(n_kv) * hd);
        p.resize(n_kv);
        for (int32_t pos = 0; pos < n_kv; ++pos) {
          const uint8_t* blk = BlockPtr(kv, s.block_table[pos / L.block_size]);
          const int slot = pos % L.block_size;
          DequantRef(L.k_type, blk + L.ByteOffset(layer, 0, kvh, slot), &kf[static_cast<size_t>(pos) * hd], hd);
          DequantRef(L.v_type, blk + L.ByteOffset(layer, 1, kvh, slot), &vf[static_cast<size_t>(pos) * hd], hd);
        }
        const float* qh = q + row * q_stride + static_cast<int64_t>(h) * hd;
        std::vector<float> q8;
        if (L.k_type != KvType::kF16) {  // Q through q8_0, as the kernels (QueryThroughQ8_0)
          std::vector<BlockQ8_0> b(static_cast<size_t>(hd / 32));
          q8.resize(static_cast<size_t>(hd));
          QuantizeRowQ8_0(qh, b.data(), hd);
          TRELLIS_CHECK(DequantizeRow(GgmlType::kQ8_0, b.data(), q8.data(), hd).ok());
          qh = q8.data();
        }
        double mx = -std::numeric_limits<double>::infinity();
        // Positions outside a sliding window get probability 0 (masked as -inf).
        const int32_t first = opt.window > 0 ? std::max(0, n_kv - opt.window) : 0;
        for (int32_t pos = 0; pos < n_kv; ++pos) {
          double dot = 0.0;
          for (int d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * kf[pos * hd + d];
          dot *= scale;
          if (opt.softcap > 0) dot = opt.softcap * std::tanh(dot / opt.softcap);
          p[pos] = pos < first ? -std::numeric_limits<float>::infinity() : static_cast<float>(dot);
          mx = std::max(mx, static_cast<double>(p[pos]));
        }
        double sum = 0.0;
        for (int32_t pos = 0; pos < n_kv; ++pos) {
          p[pos] = static_cast<float>(std::exp(p[pos] - mx));
          sum += p[pos];
        }
        float* oh = out + row * out_stride + static_cast<int64_t>(h) * hd;
        for (int d = 0; d < hd; ++d) {
          double a = 0.0;
          for (int32_t pos = 0; pos < n_kv; ++pos) a += p[pos] * vf[pos * hd + d];
          oh[d] = static_cast<float>(a / sum);
        }
      }
    }
  }
}

}  // namespace trellis
