// bench_kernels: the matmul kernels alone (Google Benchmark), for the roofline work
// (docs/ROOFLINE.md). Each weight type MatMul runs, at the TinyLlama FFN shape (5632 rows
// x 2048 columns), against 1, 8, 64 and 512 tokens, on one thread and on all of them:
// the activation conversion and the tiles, the same code path a forward pass runs. The
// counter GOP/s is 2 x rows x cols x tokens per second (one multiply-add = 2 ops), to set
// against `trellis bench roofline`'s int8 / f32 peaks measured in the same minute.
//
// The weights (random Gaussian, quantized by quant.h, or random blocks for the types
// Trellis does not write; packed as the loader packs them
// where the CPU runs packed kernels) are ~6-23 MB, so they sit in L3 here: the 1-token
// rows measure the tiles' streaming, not DRAM. The dram/... rows run 1 and 8 tokens over
// copies of the matrix that add up to 512 MiB, one after another, so every weight byte
// comes from DRAM as in a decode step; their GB/s counter (weight bytes per second) is to
// set against the dram/read rows, the same 512 MiB read by plain load loops on the same
// threads in the same run (`bench roofline`'s DRAM figure). The kernel family is the one the CPU selects; TRELLIS_ISA=avx2|scalar and
// TRELLIS_AVXVNNI=0 force others, and TRELLIS_REPACK=0 keeps the row-major layouts, as
// for the `trellis` binary.
//
// Attention/... rows run PagedAttention at the TinyLlama heads (32 query heads, 4 KV heads,
// head_dim 64, blocks of 32, f16 cache): a causal prefill of 512 tokens from position 0,
// and 8 sessions decoding one token each at context 512. Their GFLOP/s counter is
// 4 x head_dim x query heads x the positions each query attends to (QK and PV, one
// multiply-add = 2 ops), to set against the f32 FMA peak: the limit `bench speed --budget`
// gives the attention phase.
//
// usage: build/bench_kernels [--benchmark_filter=q4_0] [--benchmark_repetitions=5]
//          [--benchmark_out=FILE.csv --benchmark_out_format=csv]
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench/read_loops.h"
#include "kernels/attention.h"
#include "kernels/cpu_features.h"
#include "kernels/kernels_test_util.h"
#include "kernels/matmul.h"
#include "kernels/packed.h"
#include "kernels/quant.h"
#include "util/thread_pool.h"

namespace trellis {
namespace {

constexpr int64_t kRows = 5632, kCols = 2048;

// 64-byte aligned bytes.
struct Aligned {
  explicit Aligned(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64 + 64))) {}
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  uint8_t* p;
};

// A rows x cols matrix of `type` from Gaussian values, packed where MatMul would use it.
struct Weights {
  GgmlType type;
  std::vector<uint8_t> rows;
  std::unique_ptr<Aligned> packed;
  WeightMatrix w{};
};

std::unique_ptr<Weights> MakeWeights(GgmlType type) {
  auto m = std::make_unique<Weights>();
  m->type = type;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> row(kCols);
  const int64_t rb = RowBytes(type, kCols);
  m->rows.resize(static_cast<size_t>(rb * kRows));
  for (int64_t r = 0; r < kRows; ++r) {
    for (float& v : row) v = nd(rng);
    // Quantized, or random blocks for the types Trellis reads but does not write.
    if (!testing_util::MakeWeightRow(type, row.data(), kCols, m->rows.data() + r * rb, rng)) return nullptr;
  }
  m->w = WeightMatrix{type, m->rows.data(), kRows, kCols, rb};
  if (ChosenKernels().repack && PackableType(type) && PackingUseful(m->w)) {
    m->packed = std::make_unique<Aligned>(PackedBytes(m->w));
    PackWeights(m->w, 0, (kRows + kPackRows - 1) / kPackRows, m->packed->p);
    m->w.packed = m->packed->p;
  }
  return m;
}

// Per iteration, MatMul of each of ws (all of type `type`) against `tokens` random rows;
// counters GOP/s and, where weight_bytes (one matrix's) is given, GB/s of weights read.
void TimeMatMuls(benchmark::State& state, GgmlType type, std::span<const WeightMatrix> ws, int tokens, int threads,
                 size_t weight_bytes = 0) {
  ThreadPool pool(threads);
  std::vector<float> x(static_cast<size_t>(tokens * kCols)), y(static_cast<size_t>(tokens * kRows));
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : x) v = nd(rng);
  Aligned scratch(MatMulScratchBytes(type, kCols, tokens));
  for (auto _ : state) {
    for (const WeightMatrix& w : ws) MatMul(w, x.data(), kCols, tokens, y.data(), kRows, pool, scratch.p);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double n = static_cast<double>(ws.size());
  state.counters["GOP/s"] = benchmark::Counter(n * 2.0 * kRows * kCols * tokens / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  if (weight_bytes > 0) {
    state.counters["GB/s"] = benchmark::Counter(n * static_cast<double>(weight_bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  }
  state.counters["packed"] = ws[0].packed != nullptr;
}

void RunMatMul(benchmark::State& state, const Weights* m, int tokens, int threads) {
  TimeMatMuls(state, m->type, std::span(&m->w, 1), tokens, threads);
}

// The DRAM rows' working set: far past any L3 this runs on.
constexpr size_t kDramBytes = size_t{512} << 20;

// `bytes` of 2 MiB-aligned memory, huge pages asked for as Model::Repack does (fewer TLB
// misses while streaming), written once so its pages are real.
struct HugeBuffer {
  explicit HugeBuffer(size_t n) : bytes((n + (size_t{2} << 20) - 1) & ~((size_t{2} << 20) - 1)) {
    p = static_cast<uint8_t*>(std::aligned_alloc(size_t{2} << 20, bytes));
    if (p == nullptr) std::abort();
    madvise(p, bytes, MADV_HUGEPAGE);
    std::memset(p, 1, bytes);
  }
  ~HugeBuffer() { std::free(p); }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  size_t bytes;
  uint8_t* p;
};

// MatMul over copies of m's weights (as laid out for the kernels: packed or rows) that
// fill kDramBytes, each copy once per iteration.
void RunMatMulDram(benchmark::State& state, const Weights* m, int tokens, int threads) {
  const bool packed = m->w.packed != nullptr;
  const size_t one = packed ? PackedBytes(m->w) : m->rows.size();  // packed: a multiple of 64
  const size_t stride = (one + 4095) & ~size_t{4095};
  const size_t copies = std::max<size_t>(2, kDramBytes / stride);
  HugeBuffer ring(stride * copies);
  std::vector<WeightMatrix> ws(copies, m->w);
  for (size_t c = 0; c < copies; ++c) {
    uint8_t* dst = ring.p + c * stride;
    std::memcpy(dst, packed ? m->w.packed : m->rows.data(), one);
    if (packed) ws[c].packed = dst;
    else ws[c].data = dst;
  }
  TimeMatMuls(state, m->type, ws, tokens, threads, one);
}

// kDramBytes read by `read` on `threads` threads, each its own contiguous part.
void RunReadDram(benchmark::State& state, uint64_t (*read)(const uint8_t*, size_t), int threads) {
  HugeBuffer buf(kDramBytes);
  ThreadPool pool(threads);
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  for (auto _ : state) {
    pool.Run([&](int ith, int nth) {
      const size_t a = buf.bytes / 512 * static_cast<size_t>(ith) / static_cast<size_t>(nth) * 512;
      const size_t b = buf.bytes / 512 * static_cast<size_t>(ith + 1) / static_cast<size_t>(nth) * 512;
      sums[static_cast<size_t>(ith)] += read(buf.p + a, b - a);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(buf.bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Attention at the TinyLlama heads over a pool of f16 blocks: `sessions` sequences of
// `tokens` query rows each, the last at position `context` - 1.
void RunAttention(benchmark::State& state, int sessions, int tokens, int context, int threads) {
  constexpr int kHeads = 32, kHeadsKv = 4, kHeadDim = 64, kBlock = 32;
  const KvLayout layout{1, kHeadsKv, kHeadDim, kBlock};
  const int blocks_per_seq = (context + kBlock - 1) / kBlock;
  Aligned pool_bytes(layout.BlockBytes() * static_cast<size_t>(sessions * blocks_per_seq));
  const PagedKv kv{pool_bytes.p, layout};
  std::vector<int32_t> tables(static_cast<size_t>(sessions * blocks_per_seq));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.f, 1.f);
  // Every position's K and V written once (as prefill would), then the measured rows.
  const int64_t kv_width = kHeadsKv * kHeadDim, q_width = kHeads * kHeadDim;
  std::vector<float> k(static_cast<size_t>(context * kv_width)), v(k.size());
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  std::vector<AttnSeq> seqs;
  for (int s = 0; s < sessions; ++s) {
    const AttnSeq all{tables.data() + s * blocks_per_seq, 0, context, 0};
    KvWrite(kv, 0, std::span(&all, 1), k.data(), kv_width, v.data(), kv_width);
    seqs.push_back(AttnSeq{tables.data() + s * blocks_per_seq, context - tokens, tokens, s * tokens});
  }
  std::vector<float> q(static_cast<size_t>(sessions * tokens * q_width)), out(q.size());
  for (float& x : q) x = nd(rng);
  ThreadPool pool(threads);
  std::vector<float> scratch(AttentionScratchFloats(threads, kHeadDim, kBlock));
  for (auto _ : state) {
    PagedAttention(kv, 0, seqs, q.data(), q_width, kHeads, 0.125f, out.data(), q_width, pool, scratch.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  double attended = 0;  // positions summed over query rows
  for (int i = 0; i < tokens; ++i) attended += context - tokens + i + 1;
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * kHeadDim * kHeads * attended * sessions / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace
}  // namespace trellis

int main(int argc, char** argv) {
  using namespace trellis;
  ChooseKernels(KernelChoiceFromValues(std::getenv("TRELLIS_ISA"), std::getenv("TRELLIS_AVXVNNI"),
                                       std::getenv("TRELLIS_NEON_DOTPROD"), std::getenv("TRELLIS_REPACK")));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  benchmark::AddCustomContext("kernels", KernelIsaName(BestKernelIsa()));
  std::vector<std::unique_ptr<Weights>> keep;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kIQ4_NL,
                        GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                        GgmlType::kIQ4_XS, GgmlType::kF16, GgmlType::kBF16}) {
    auto m = MakeWeights(type);
    if (!m) {
      std::fprintf(stderr, "bench_kernels: cannot quantize %s\n", std::string(GetGgmlTypeTraits(type).name).c_str());
      return 1;
    }
    for (int threads : {1, all}) {
      for (int tokens : {1, 8, 64, 512}) {
        const std::string name = std::string(GetGgmlTypeTraits(type).name) + "/tokens:" + std::to_string(tokens) +
                                 "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), RunMatMul, m.get(), tokens, threads)->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
      if (all == 1) break;
    }
    keep.push_back(std::move(m));
  }
  for (int threads : {1, all}) {
    const std::string t = "/threads:" + std::to_string(threads);
    const CpuFeatures& f = GetCpuFeatures();
    if (f.avx512f) benchmark::RegisterBenchmark(("dram/read/zmm" + t).c_str(), RunReadDram, bench::ReadZmm, threads)->UseRealTime();
    if (f.avx2) benchmark::RegisterBenchmark(("dram/read/ymm" + t).c_str(), RunReadDram, bench::ReadYmm, threads)->UseRealTime();
    for (const auto& m : keep) {
      for (int tokens : {1, 8}) {
        const std::string name = "dram/" + std::string(GetGgmlTypeTraits(m->type).name) + "/tokens:" + std::to_string(tokens) + t;
        benchmark::RegisterBenchmark(name.c_str(), RunMatMulDram, m.get(), tokens, threads)->UseRealTime()->Unit(benchmark::kMillisecond);
      }
    }
    if (all == 1) break;
  }
  for (int threads : {1, all}) {
    const std::string t = "/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(("Attention/prefill:512" + t).c_str(), RunAttention, 1, 512, 512, threads)
        ->UseRealTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("Attention/sessions:8/context:512" + t).c_str(), RunAttention, 8, 1, 512, threads)
        ->UseRealTime()->Unit(benchmark::kMicrosecond);
    if (all == 1) break;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
