#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_internal.h"
#include "kernels/quant.h"
#include "util/fp16.h"

namespace trellis {
namespace {

using internal::SimdLevel;

TEST(KvTest, LayoutMatchesDocumentedFormula) {
  const KvLayout tiny{22, 4, 64, 32};
  EXPECT_EQ(tiny.BlockBytes(), 720896u);
  const KvLayout L{3, 2, 16, 8};
  EXPECT_EQ(L.BlockBytes(), 3u * 2 * 2 * 8 * 16 * 2);
  for (int l = 0; l < 3; ++l)
    for (int c = 0; c < 2; ++c)
      for (int h = 0; h < 2; ++h)
        for (int t = 0; t < 8; ++t) {
          EXPECT_EQ(L.ByteOffset(l, c, h, t), static_cast<size_t>((((l * 2 + c) * 2 + h) * 8 + t) * 16) * 2);
        }
  // The last row of the block ends the block.
  EXPECT_EQ(L.ByteOffset(2, 1, 1, 7) + 32, L.BlockBytes());
  // q8_0: a row of head_dim 64 is 2 blocks of 34 bytes; TinyLlama's block holds 1.88x the
  // tokens of f16 in the same bytes, q4_0 (18-byte blocks) 3.56x.
  const KvLayout q8{22, 4, 64, 32, KvType::kQ8_0, KvType::kQ8_0};
  EXPECT_EQ(q8.RowBytes(0), 68u);
  EXPECT_EQ(q8.BlockBytes(), 22u * 2 * 4 * 32 * 68);
  EXPECT_EQ(q8.ByteOffset(3, 1, 2, 5), 3u * 2 * 4 * 32 * 68 + 4u * 32 * 68 + 2u * 32 * 68 + 5u * 68);
  const KvLayout q4{22, 4, 64, 32, KvType::kQ4_0, KvType::kQ4_0};
  EXPECT_EQ(q4.RowBytes(1), 36u);
  EXPECT_EQ(q4.BlockBytes(), 22u * 2 * 4 * 32 * 36);
  // Mixed: K q8_0, V f16: the V tiles start after all K tiles of the layer.
  const KvLayout mixed{2, 2, 32, 8, KvType::kQ8_0, KvType::kF16};
  EXPECT_EQ(mixed.ByteOffset(0, 1, 0, 0), 2u * 8 * 34);
  EXPECT_EQ(mixed.ByteOffset(1, 0, 0, 0), mixed.LayerBytes());
  EXPECT_EQ(mixed.LayerBytes(), 1600u);  // 2 * 8 * 34 + 2 * 8 * 64 = 1568, padded to 64
  // A layer that is not a multiple of 64 bytes is padded to one (blocks stay aligned and
  // split into equal layer slices).
  const KvLayout odd{3, 1, 32, 8, KvType::kQ4_0, KvType::kQ4_0};
  EXPECT_EQ(odd.LayerBytes(), 320u);  // 2 * 8 * 18 = 288
  EXPECT_EQ(odd.BlockBytes(), 960u);
  // Type codes: both f16 is 0 (what the store's namespaces held before the types).
  EXPECT_EQ(L.TypeCode(), 0u);
  EXPECT_EQ(mixed.TypeCode(), 1u);
  KvType k, v;
  ASSERT_TRUE(KvTypesFromCode(0x0201, &k, &v));
  EXPECT_EQ(k, KvType::kQ8_0);
  EXPECT_EQ(v, KvType::kQ4_0);
  EXPECT_FALSE(KvTypesFromCode(0x0300, &k, &v));
  EXPECT_FALSE(KvTypesFromCode(0x10000, &k, &v));
  for (KvType x : {KvType::kF16, KvType::kQ8_0, KvType::kQ4_0}) {
    ASSERT_TRUE(ParseKvType(KvTypeName(x), &k));
    EXPECT_EQ(k, x);
  }
  EXPECT_FALSE(ParseKvType("q4_1", &k));
  EXPECT_FALSE(ParseKvType("", &k));
}

// The rotation around a quantized cache: H_n / sqrt(n) per chunk, H_n built as llama.cpp
// builds its matrix (Sylvester: H_2s = [[H_s, H_s], [H_s, -H_s]]), its own inverse; the
// chunk sizes llama.cpp picks (K: the largest power of two dividing head_dim, V: 64,
// nothing for f16 or head_dim not a multiple of 64).
TEST(KvTest, HadamardRotationIsLlamaCppsAndItsOwnInverse) {
  for (int n : {64, 128, 256}) {
    std::vector<float> h(static_cast<size_t>(n) * n);
    h[0] = 1.0f / std::sqrt(static_cast<float>(n));
    for (int s = 1; s < n; s *= 2) {
      for (int i = 0; i < s; ++i) {
        for (int j = 0; j < s; ++j) {
          const float v = h[i * n + j];
          h[(i + s) * n + j] = v;
          h[i * n + j + s] = v;
          h[(i + s) * n + j + s] = -v;
        }
      }
    }
    std::mt19937 rng(n);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    const int64_t width = 2 * n, stride = width + 3;
    std::vector<float> x(3 * stride);
    for (float& v : x) v = dist(rng);
    std::vector<float> y = x;
    HadamardRows(y.data(), stride, 3, width, n);
    for (int r = 0; r < 3; ++r) {
      for (int c0 = 0; c0 < width; c0 += n) {
        for (int i = 0; i < n; ++i) {
          double want = 0;
          for (int j = 0; j < n; ++j) want += static_cast<double>(h[i * n + j]) * x[r * stride + c0 + j];
          ASSERT_NEAR(y[r * stride + c0 + i], want, 1e-5) << "n " << n << " row " << r << " chunk " << c0 << " i " << i;
        }
      }
      for (int64_t c = width; c < stride; ++c) EXPECT_EQ(y[r * stride + c], x[r * stride + c]);  // past width: untouched
    }
    HadamardRows(y.data(), stride, 3, width, n);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5);
  }
  EXPECT_EQ(KvRotationK(KvLayout{1, 1, 128, 8, KvType::kQ8_0, KvType::kF16}), 128);
  EXPECT_EQ(KvRotationK(KvLayout{1, 1, 192, 8, KvType::kQ4_0, KvType::kF16}), 64);
  EXPECT_EQ(KvRotationK(KvLayout{1, 1, 256, 8, KvType::kQ4_0, KvType::kF16}), 256);
  EXPECT_EQ(KvRotationK(KvLayout{1, 1, 96, 8, KvType::kQ8_0, KvType::kQ8_0}), 0);
  EXPECT_EQ(KvRotationK(KvLayout{1, 1, 128, 8, KvType::kF16, KvType::kQ8_0}), 0);
  EXPECT_EQ(KvRotationV(KvLayout{1, 1, 256, 8, KvType::kF16, KvType::kQ8_0}), 64);
  EXPECT_EQ(KvRotationV(KvLayout{1, 1, 256, 8, KvType::kQ8_0, KvType::kF16}), 0);
  EXPECT_EQ(KvRotationV(KvLayout{1, 1, 96, 8, KvType::kQ8_0, KvType::kQ4_0}), 0);
}

GgmlType GgmlOf(KvType t) {
  return t == KvType::kF16 ? GgmlType::kF16 : t == KvType::kQ8_0 ? GgmlType::kQ8_0 : GgmlType::kQ4_0;
}

// x (rows of n_head_kv heads of head_dim) as the cache stores it: each head's row through
// the type's reference quantizer and back.
void RoundTrip(KvType t, std::vector<float>& x, int head_dim) {
  std::vector<uint8_t> buf(KvRowBytes(t, head_dim));
  for (size_t i = 0; i + head_dim <= x.size(); i += head_dim) {
    ASSERT_TRUE(QuantizeRow(GgmlOf(t), &x[i], buf.data(), head_dim).ok());
    ASSERT_TRUE(DequantizeRow(GgmlOf(t), buf.data(), &x[i], head_dim).ok());
  }
}

// A KV pool plus a batch of sequences with random K/V and queries, kept in f32 as well
// so tests can build a dense reference.
struct Scenario {
  int n_head, n_head_kv, head_dim, block_size;
  std::vector<std::pair<int, int>> seq_shapes;  // (pos0, n_tokens)
  int layer = 1;
  KvLayout layout{};
  std::vector<uint16_t> pool;                    // [n_blocks][block_bytes / 2]
  std::vector<std::vector<int32_t>> tables;      // per sequence
  std::vector<std::vector<float>> k_all, v_all;  // per sequence [pos][n_head_kv*head_dim]
  std::vector<std::vector<float>> k_held, v_held;  // the same as the cache holds them
  std::vector<AttnSeq> seqs;
  std::vector<float> q;  // [n_rows][q_stride]
  int64_t q_stride = 0, n_rows = 0;

  PagedKv Kv() { return PagedKv{reinterpret_cast<uint8_t*>(pool.data()), layout}; }
  int64_t KvWidth() const { return static_cast<int64_t>(n_head_kv) * head_dim; }
};

Scenario MakeScenario(int n_head, int n_head_kv, int head_dim, int block_size,
                      std::vector<std::pair<int, int>> shapes, uint32_t seed, KvType kt = KvType::kF16,
                      KvType vt = KvType::kF16) {
  Scenario sc;
  sc.n_head = n_head;
  sc.n_head_kv = n_head_kv;
  sc.head_dim = head_dim;
  sc.block_size = block_size;
  sc.seq_shapes = std::move(shapes);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  sc.layout = KvLayout{2, n_head_kv, head_dim, block_size, kt, vt};
  int n_blocks = 3;
  for (auto [pos0, n] : sc.seq_shapes) n_blocks += (pos0 + n + block_size - 1) / block_size;
  // NaN bits everywhere: slots that were never written must not leak into results.
  sc.pool.assign(static_cast<size_t>(n_blocks) * sc.layout.BlockBytes() / 2, 0xFFFF);
  std::vector<int32_t> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next_id = 0;
  const int64_t w = sc.KvWidth();
  for (auto [pos0, n] : sc.seq_shapes) {
    const int nb = (pos0 + n + block_size - 1) / block_size;
    sc.tables.emplace_back(ids.begin() + next_id, ids.begin() + next_id + nb);
    next_id += nb;
    std::vector<float> k((pos0 + n) * w), v((pos0 + n) * w);
    for (float& x : k) x = 2.0f * dist(rng);
    for (float& x : v) x = dist(rng);
    sc.k_held.push_back(k);
    sc.v_held.push_back(v);
    RoundTrip(kt, sc.k_held.back(), head_dim);
    RoundTrip(vt, sc.v_held.back(), head_dim);
    sc.k_all.push_back(std::move(k));
    sc.v_all.push_back(std::move(v));
  }
  // Existing prefixes, one KvWrite per sequence.
  for (size_t i = 0; i < sc.seq_shapes.size(); ++i) {
    const int pos0 = sc.seq_shapes[i].first;
    if (pos0 == 0) continue;
    const AttnSeq s{sc.tables[i].data(), 0, pos0, 0};
    KvWrite(sc.Kv(), sc.layer, std::span(&s, 1), sc.k_all[i].data(), w, sc.v_all[i].data(), w);
  }
  // The batch: new tokens of every sequence, written in one call with padded strides.
  const int64_t kv_stride = w + 5;
  for (size_t i = 0; i < sc.seq_shapes.size(); ++i) {
    auto [pos0, n] = sc.seq_shapes[i];
    sc.seqs.push_back(AttnSeq{sc.tables[i].data(), pos0, n, static_cast<int32_t>(sc.n_rows)});
    sc.n_rows += n;
  }
  std::vector<float> kb(sc.n_rows * kv_stride), vb(sc.n_rows * kv_stride);
  for (size_t i = 0; i < sc.seqs.size(); ++i) {
    const AttnSeq& s = sc.seqs[i];
    for (int t = 0; t < s.n_tokens; ++t) {
      for (int64_t e = 0; e < w; ++e) {
        kb[(s.q_row0 + t) * kv_stride + e] = sc.k_all[i][(s.pos0 + t) * w + e];
        vb[(s.q_row0 + t) * kv_stride + e] = sc.v_all[i][(s.pos0 + t) * w + e];
      }
    }
  }
  KvWrite(sc.Kv(), sc.layer, sc.seqs, kb.data(), kv_stride, vb.data(), kv_stride);
  sc.q_stride = static_cast<int64_t>(n_head) * head_dim + 3;
  sc.q.resize(sc.n_rows * sc.q_stride);
  for (float& x : sc.q) x = 3.0f * dist(rng);
  return sc;
}

// Dense f32 causal attention on K/V as the cache holds them (f16-rounded or quantized
// and back) for sequence i, row t, head h.
// (With a window, only the last `window` positions; with a softcap, capped scores.)
std::vector<float> NaiveDense(const Scenario& sc, size_t i, int t, int h, float scale, const AttnOptions& opt) {
  const int hd = sc.head_dim, kvh = h / (sc.n_head / sc.n_head_kv);
  const int n_kv = sc.seqs[i].pos0 + t + 1;
  const int first = opt.window > 0 ? std::max(0, n_kv - opt.window) : 0;
  const float* qrow = sc.q.data() + (sc.seqs[i].q_row0 + t) * sc.q_stride + h * hd;
  // Against a quantized K the query goes through q8_0 (llama.cpp's K.Q dot, docs/kv_layout.md).
  std::vector<float> q(qrow, qrow + hd);
  if (sc.layout.k_type != KvType::kF16) RoundTrip(KvType::kQ8_0, q, hd);
  const float* qh = q.data();
  std::vector<float> p(n_kv - first), o(hd, 0.0f);
  for (int j = first; j < n_kv; ++j) {
    float dot = 0.0f;
    for (int d = 0; d < hd; ++d) dot += qh[d] * sc.k_held[i][j * sc.KvWidth() + kvh * hd + d];
    dot *= scale;
    if (opt.softcap > 0) dot = opt.softcap * std::tanh(dot / opt.softcap);
    p[j - first] = dot;
  }
  const float mx = *std::max_element(p.begin(), p.end());
  float sum = 0.0f;
  for (float& x : p) sum += (x = std::exp(x - mx));
  for (int j = first; j < n_kv; ++j)
    for (int d = 0; d < hd; ++d) o[d] += p[j - first] / sum * sc.v_held[i][j * sc.KvWidth() + kvh * hd + d];
  return o;
}

void CheckScenario(Scenario& sc, const AttnOptions& opt = {}) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(sc.head_dim));
  const int64_t width = static_cast<int64_t>(sc.n_head) * sc.head_dim;
  const int64_t out_stride = width + 7;
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> ref(sc.n_rows * out_stride, kNan);
  PagedAttentionRef(sc.Kv(), sc.layer, sc.seqs, sc.q.data(), sc.q_stride, sc.n_head, scale,
                    ref.data(), out_stride, opt);
  // Reference vs the dense f32 attention on the K/V values the cache holds.
  for (size_t i = 0; i < sc.seqs.size(); ++i) {
    for (int t = 0; t < sc.seqs[i].n_tokens; ++t) {
      for (int h = 0; h < sc.n_head; ++h) {
        const auto o = NaiveDense(sc, i, t, h, scale, opt);
        for (int d = 0; d < sc.head_dim; ++d) {
          ASSERT_NEAR(ref[(sc.seqs[i].q_row0 + t) * out_stride + h * sc.head_dim + d], o[d], 5e-3f)
              << "seq " << i << " row " << t << " head " << h;
        }
      }
    }
  }
  for (SimdLevel level : internal::SupportedSimdLevels()) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE("level " + std::to_string(static_cast<int>(level)) + " threads " +
                   std::to_string(threads));
      ThreadPool pool(threads);
      std::vector<float> scratch(
          AttentionScratchFloats(threads, sc.head_dim, sc.block_size), kNan);
      std::vector<float> out(sc.n_rows * out_stride, kNan);
      internal::PagedAttentionAt(level, sc.Kv(), sc.layer, sc.seqs, sc.q.data(), sc.q_stride,
                                 sc.n_head, scale, out.data(), out_stride, pool, scratch.data(), opt);
      for (int64_t r = 0; r < sc.n_rows; ++r) {
        for (int64_t e = 0; e < width; ++e) {
          ASSERT_NEAR(out[r * out_stride + e], ref[r * out_stride + e], 2e-5f)
              << "row " << r << " elem " << e;
        }
        for (int64_t e = width; e < out_stride; ++e) ASSERT_TRUE(std::isnan(out[r * out_stride + e]));
      }
    }
  }
}

TEST(KvTest, WriteThenReadBack) {
  for (auto [kt, vt] : {std::pair{KvType::kF16, KvType::kF16}, {KvType::kQ8_0, KvType::kQ4_0}, {KvType::kQ4_0, KvType::kF16}}) {
    SCOPED_TRACE(std::string(KvTypeName(kt)) + "/" + KvTypeName(vt));
    Scenario sc = MakeScenario(4, 2, 32, 8, {{0, 5}, {11, 6}, {3, 1}}, 7, kt, vt);
    const int64_t w = sc.KvWidth();
    const uint8_t* base = reinterpret_cast<const uint8_t*>(sc.pool.data());
    for (size_t i = 0; i < sc.seqs.size(); ++i) {
      const int n_pos = sc.seqs[i].pos0 + sc.seqs[i].n_tokens;
      for (int p = 0; p < n_pos; ++p) {
        const uint8_t* blk = base + static_cast<size_t>(sc.tables[i][p / 8]) * sc.layout.BlockBytes();
        for (int h = 0; h < 2; ++h) {
          for (int c = 0; c < 2; ++c) {
            const KvType type = c == 0 ? kt : vt;
            const float* x = (c == 0 ? sc.k_all : sc.v_all)[i].data() + p * w + h * 32;
            std::vector<uint8_t> want(KvRowBytes(type, 32));
            ASSERT_TRUE(QuantizeRow(GgmlOf(type), x, want.data(), 32).ok());
            ASSERT_EQ(0, std::memcmp(blk + sc.layout.ByteOffset(sc.layer, c, h, p % 8), want.data(), want.size()))
                << "seq " << i << " pos " << p << " head " << h << " kv " << c;
          }
        }
      }
    }
    // Layer 0 untouched.
    const uint8_t* blk0 = base + static_cast<size_t>(sc.tables[0][0]) * sc.layout.BlockBytes();
    EXPECT_EQ(blk0[sc.layout.ByteOffset(0, 0, 0, 0)], 0xFF);
  }
  // The SIMD write equals the scalar reference bit for bit (incl. odd sizes, subnormals).
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  KvLayout L{1, 1, 12, 8};
  std::vector<uint16_t> a(L.BlockBytes() / 2), b(L.BlockBytes() / 2);
  std::vector<float> kv(8 * 12);
  for (size_t j = 0; j < kv.size(); ++j) kv[j] = dist(rng) * (j % 3 == 0 ? 1e-9f : 1.0f);
  const int32_t table[1] = {0};
  const AttnSeq s{table, 0, 8, 0};
  KvWrite(PagedKv{reinterpret_cast<uint8_t*>(a.data()), L}, 0, std::span(&s, 1), kv.data(), 12,
          kv.data(), 12);
  KvWriteRef(PagedKv{reinterpret_cast<uint8_t*>(b.data()), L}, 0, std::span(&s, 1), kv.data(),
             12, kv.data(), 12);
  EXPECT_EQ(a, b);
}

// Quantized K and V, alone and mixed with f16, every ISA level against the reference,
// and the reference against dense attention on the values the cache holds: GQA and MHA,
// head_dim 32, 64, 128, blocks of 8 to 32, a sliding window with a soft-cap.
TEST(AttentionTest, QuantizedKvMatchesRef) {
  const std::pair<KvType, KvType> types[] = {{KvType::kQ8_0, KvType::kQ8_0},
                                             {KvType::kQ4_0, KvType::kQ4_0},
                                             {KvType::kQ8_0, KvType::kF16},
                                             {KvType::kF16, KvType::kQ4_0}};
  for (auto [kt, vt] : types) {
    SCOPED_TRACE(std::string(KvTypeName(kt)) + "/" + KvTypeName(vt));
    for (int bs : {8, 16, 32}) {
      SCOPED_TRACE(bs);
      Scenario a = MakeScenario(4, 2, 64, bs, {{0, 13}, {5, 1}, {17, 9}, {40, 1}}, 31, kt, vt);
      CheckScenario(a);
      Scenario b = MakeScenario(32, 4, 32, bs, {{0, 40}, {100, 7}, {9, 1}}, 32, kt, vt);
      CheckScenario(b);
    }
    Scenario c = MakeScenario(4, 4, 128, 16, {{70, 25}, {0, 1}, {31, 2}}, 33, kt, vt);
    CheckScenario(c);
    Scenario d = MakeScenario(8, 2, 64, 16, {{0, 37}, {40, 1}, {19, 9}}, 34, kt, vt);
    CheckScenario(d, AttnOptions{2.0f, 5});
  }
}

TEST(AttentionTest, MatchesRefGqa4x2) {
  for (int bs : {8, 16, 32}) {
    SCOPED_TRACE(bs);
    Scenario sc = MakeScenario(4, 2, 64, bs, {{0, 13}, {5, 1}, {17, 9}, {40, 1}}, 11);
    CheckScenario(sc);
  }
}

TEST(AttentionTest, MatchesRefGqa8x2Dim32) {
  for (int bs : {8, 16, 32}) {
    SCOPED_TRACE(bs);
    Scenario sc = MakeScenario(8, 2, 32, bs, {{0, 37}, {33, 1}, {3, 20}}, 12);
    CheckScenario(sc);
  }
}

TEST(AttentionTest, MatchesRefMha4x4) {
  for (int bs : {8, 16, 32}) {
    SCOPED_TRACE(bs);
    Scenario sc = MakeScenario(4, 4, 64, bs, {{70, 25}, {0, 1}, {31, 2}, {64, 1}}, 13);
    CheckScenario(sc);
  }
}

TEST(AttentionTest, MatchesRefGqa32x4) {
  for (int hd : {64, 32}) {
    for (int bs : {8, 16, 32}) {
      SCOPED_TRACE(std::to_string(hd) + "/" + std::to_string(bs));
      Scenario sc = MakeScenario(32, 4, hd, bs, {{0, 40}, {100, 7}, {9, 1}}, 14);
      CheckScenario(sc);
    }
  }
}

TEST(AttentionTest, MatchesRefOddShapes) {
  // head_dim 128 (wide accumulators), n_rep 80 > AttnMaxQueries (head chunks), head_dim 72
  // (8- but not 16-lane), and a shape no SIMD path takes (head_dim 20, block_size 5).
  Scenario a = MakeScenario(8, 1, 128, 16, {{20, 18}, {0, 1}}, 15);
  CheckScenario(a);
  static_assert(internal::kAttnMaxQueries < 80);
  Scenario b = MakeScenario(160, 2, 32, 16, {{7, 5}, {30, 1}}, 16);
  CheckScenario(b);
  Scenario c = MakeScenario(6, 3, 72, 16, {{0, 19}, {12, 3}}, 17);
  CheckScenario(c);
  Scenario d = MakeScenario(4, 2, 20, 5, {{0, 12}, {9, 4}}, 18);
  CheckScenario(d);
}

// Gemma's sliding window and soft-capping, every level: windows shorter than a block,
// spanning blocks, of one position, longer than the sequence; alone and with a cap.
TEST(AttentionTest, MatchesRefWithSlidingWindowAndSoftcap) {
  for (int bs : {8, 16}) {
    for (int32_t window : {1, 5, 16, 23, 1000}) {
      for (float cap : {0.0f, 2.0f}) {
        SCOPED_TRACE(std::to_string(bs) + " window " + std::to_string(window) + " cap " + std::to_string(cap));
        Scenario sc = MakeScenario(8, 2, 64, bs, {{0, 37}, {40, 1}, {19, 9}, {2, 3}}, 21);
        CheckScenario(sc, AttnOptions{cap, window});
      }
    }
  }
  Scenario odd = MakeScenario(4, 2, 20, 5, {{0, 12}, {9, 4}}, 22);  // the scalar tile
  CheckScenario(odd, AttnOptions{3.0f, 6});
}

TEST(AttentionTest, SingleTokenEqualsItsValue) {
  Scenario sc = MakeScenario(8, 2, 64, 16, {{0, 1}}, 19);
  ThreadPool pool(2);
  std::vector<float> scratch(AttentionScratchFloats(2, 64, 16));
  std::vector<float> out(8 * 64);
  PagedAttention(sc.Kv(), sc.layer, sc.seqs, sc.q.data(), sc.q_stride, 8, 0.125f, out.data(),
                 8 * 64, pool, scratch.data());
  for (int h = 0; h < 8; ++h) {
    for (int d = 0; d < 64; ++d) {
      const float v = Fp16ToFp32(Fp32ToFp16(sc.v_all[0][(h / 4) * 64 + d]));
      ASSERT_NEAR(out[h * 64 + d], v, 1e-6f);
    }
  }
}

}  // namespace
}  // namespace trellis
