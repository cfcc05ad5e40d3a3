// trellis bench roofline: the machine's limits for the benchmarks of docs/BENCHMARKS.md
// (issue 3; results and the arithmetic in docs/ROOFLINE.md).
//
// Measured for 1 thread and for --threads threads; each figure is the median of several
// short repetitions, after one untimed warm-up repetition:
//   DRAM read   every thread sums its own part of one 512 MiB buffer (bigger than any
//               L3), one pass per repetition; bytes / seconds. zmm loads and ymm loads
//               (the ceilings take the better), scalar without AVX2.
//   L2 read     every thread sums its own 256 KiB buffer over and over; same loads.
//   int8 dot    vpdpbusd zmm (AVX-512 VNNI), 16 independent accumulators; a multiply-add
//               counts as 2 ops. Without it: {vex} vpdpbusd ymm (AVX-VNNI, 12), else
//               vpmaddubsw + vpmaddwd + vpaddd ymm (AVX2, 6 chains).
//   f32 FMA     vfmadd231ps zmm, 16 independent accumulators (AVX2: ymm, 12); 2 FLOP each.
//   bf16 dot    vdpbf16ps zmm (AVX512_BF16), 16 accumulators; 2 FLOP per bf16 pair.
//   pipe shares (AVX-512 VNNI, 1 thread, not in --limits) the int8 dot with 8 of another
//               instruction per 16 vpdpbusd (vmulps, vfmadd231ps, vpmulld, vpdpwssd,
//               vcvtdq2ps, vpaddd): the int8 dot's rate where it runs on other pipes,
//               2/3 of it where it takes the same two; the tiles' ceilings follow.
//               And where the activation dwords come from: 16 vpdpbusd beside 2 zmm
//               weight loads, each with a broadcast memory operand or 8 register
//               broadcasts shared by two (the two-group tiles).
//   clock       16 dependent 1-cycle integer adds per loop (1 thread): the core clock the
//               peaks ran at, so peak / clock gives ops per cycle.
// The peak loops are inline assembly, so the compiler can neither fold them (a naive
// intrinsic loop with a loop-invariant product gets turned into adds) nor spill the
// accumulators: the loop body is exactly the instructions written below (check with
// `objdump -d --no-show-raw-insn build/trellis | grep -A20 vpdpbusd`).
// Paths are chosen from cpuid (kernels/cpu_features.h); TRELLIS_ISA=scalar|avx2 caps
// them as it caps the kernels, so the fallbacks can be run on an AVX-512 machine.
//
// Then the ceilings those figures put on the TinyLlama shape (ModelShapeByName, vocab
// 32000), per token: decode reads every matmul weight once (bytes below; token_embd is
// only gathered, one row per token, and the K/V read at these contexts is < 1 MB), and
// prefill does one multiply-add per matmul weight (MACs below; attention adds ~2 % at
// pp512 and is left out).
//   decode tok/s   <= DRAM bandwidth / weight bytes
//   prefill tok/s  <= int8 peak / (2 x MACs) for Q4_0 and Q4_K_M (their dot products
//                     run on int8), f32 FMA peak / (2 x MACs) for F16
//   b sessions decoding together read the weights once per step for b tokens:
//                  tok/s <= b / max(bytes / bandwidth, b x 2 x MACs / peak)
#include "bench/roofline.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bench/read_loops.h"
#include "bench/report.h"
#include "engine/random_model.h"
#include "kernels/cpu_features.h"
#include "util/clock.h"

namespace trellis::bench {
namespace {

// The read loops' sums and the peak loops' accumulators end here, so none is dead code.
volatile uint64_t g_sink;

using bench::Median;

// ---- Which instruction paths this CPU runs ------------------------------------------

struct Paths {
  bool avx2 = false;      // ymm loads, vfmadd231ps ymm, vpmaddubsw ymm (needs FMA too)
  bool avx512 = false;    // zmm loads, vfmadd231ps zmm
  bool vnni512 = false;   // vpdpbusd zmm
  bool bf16_512 = false;  // vdpbf16ps zmm
  bool avxvnni = false;   // {vex} vpdpbusd ymm
};

Paths ChoosePaths() {
  const CpuFeatures& f = GetCpuFeatures();
  // The kernel choice's cap (TRELLIS_ISA), as BestKernelIsa() takes it: scalar 0, avx2 1, else all.
  const std::optional<KernelIsa> chosen = ChosenKernels().cap;
  const int cap = chosen == KernelIsa::kScalar ? 0 : chosen == KernelIsa::kAvx2 ? 1 : 2;
  Paths p;
  p.avx2 = cap >= 1 && f.avx2 && f.fma;
  p.avx512 = cap >= 2 && f.avx512f;
  p.vnni512 = p.avx512 && f.avx512vnni;
  p.bf16_512 = p.avx512 && f.avx512bf16;
  p.avxvnni = p.avx2 && AvxVnniEnabled();  // TRELLIS_AVXVNNI=0: the kernels' plain AVX2 path
  return p;
}

// ---- Peak loops: `n` >= 1 iterations of exactly the instructions in the string ------
// zmm loops: accumulators are zmm0..zmm15, named in the assembly (16 "+v" operands would
// exceed GCC's 30 asm operands), zeroed before the loop and folded into one stored value
// after it; %[x] %[y] are the sources (never in zmm0..15: those are clobbered).
// ymm loops (16 registers): accumulators are "+v" operands %[aK]. Every instruction on an
// accumulator reads and writes it; `dec`/`jnz` count iterations.

#define TRELLIS_R6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define TRELLIS_R12(X) TRELLIS_R6(X) X(6) X(7) X(8) X(9) X(10) X(11)
#define TRELLIS_R16(X) TRELLIS_R12(X) X(12) X(13) X(14) X(15)
#define TRELLIS_R1_15(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define TRELLIS_ACC(i) [a##i] "+v"(acc[i]),

#define TRELLIS_ZERO_Z(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
#define TRELLIS_FOLD_Z(i) "vpxorq %%zmm" #i ", %%zmm0, %%zmm0\n\t"
#define TRELLIS_FMA_Z(i) "vfmadd231ps %[y], %[x], %%zmm" #i "\n\t"
#define TRELLIS_VNNI_Z(i) "vpdpbusd %[y], %[x], %%zmm" #i "\n\t"
#define TRELLIS_BF16_Z(i) "vdpbf16ps %[y], %[x], %%zmm" #i "\n\t"
#define TRELLIS_ZMM_LOOP(OP)                                                          \
  TRELLIS_R16(TRELLIS_ZERO_Z) "1:\n\t" TRELLIS_R16(OP) "dec %[n]\n\t"                 \
                                                       "jnz 1b\n\t" TRELLIS_R1_15(   \
                                                           TRELLIS_FOLD_Z) "vmovdqu64 %%zmm0, %[out]"
#define TRELLIS_ZMM_CLOBBERS                                                                              \
  "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
      "xmm12", "xmm13", "xmm14", "xmm15"

#define TRELLIS_FMA(i) "vfmadd231ps %[y], %[x], %[a" #i "]\n\t"
#define TRELLIS_VEX_VNNI(i) "%{vex%} vpdpbusd %[y], %[x], %[a" #i "]\n\t"
// AVX2 int8: t = maddubs(x u8, y s8) (32 products summed in pairs to i16), widened and
// summed in pairs to i32 by vpmaddwd with ones, added to the accumulator.
#define TRELLIS_MADDUBS(i)                      \
  "vpmaddubsw %[y], %[x], %[t" #i "]\n\t"       \
  "vpmaddwd %[one], %[t" #i "], %[t" #i "]\n\t" \
  "vpaddd %[t" #i "], %[a" #i "], %[a" #i "]\n\t"
#define TRELLIS_TMP(i) [t##i] "=&v"(tmp[i]),
#define TRELLIS_ADD1(i) "add $1, %[c]\n\t"

__attribute__((target("avx512f"))) void SinkZmm(__m512i v) {
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, v);
  uint64_t s = 0;
  for (uint64_t x : lanes) s += x;
  g_sink = g_sink + s;
}

__attribute__((target("avx2"))) void SinkYmm(const __m256i* v, int n) {
  __m256i s = v[0];
  for (int i = 1; i < n; ++i) s = _mm256_xor_si256(s, v[i]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  g_sink = g_sink + lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// 16 x vfmadd231ps zmm: 16 x 16 lanes x 2 FLOP = 512 per iteration.
__attribute__((target("avx512f"))) void FmaZmm(int64_t n) {
  const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-7f);
  __m512i out;
  asm volatile(TRELLIS_ZMM_LOOP(TRELLIS_FMA_Z) : [n] "+r"(n), [out] "=m"(out) : [x] "v"(x), [y] "v"(y)
               : TRELLIS_ZMM_CLOBBERS);
  SinkZmm(out);
}

// 16 x vpdpbusd zmm: 16 x 64 u8*s8 products x 2 = 2048 ops per iteration.
__attribute__((target("avx512f,avx512vnni"))) void VnniZmm(int64_t n) {
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-5);
  __m512i out;
  asm volatile(TRELLIS_ZMM_LOOP(TRELLIS_VNNI_Z) : [n] "+r"(n), [out] "=m"(out) : [x] "v"(x), [y] "v"(y)
               : TRELLIS_ZMM_CLOBBERS);
  SinkZmm(out);
}

// The packed Q4_0 / Q8_0 tiles' arithmetic for one 32-element block of 8 tokens
// (kernels/packed_avx512.cc), loads and unpacking left out: per token 8 vpdpbusd into its
// int32 accumulator (zmm0..7), then vcvtdq2ps, vmulps (the rows' scales times the token's)
// and vfmadd231ps into its f32 accumulator (zmm8..15): 64 x 64 x 2 = 8192 int8 ops per
// iteration. Its rate over int8_dot's is the most those tiles can reach on this core.
#define TRELLIS_DP8_Z(i) \
  TRELLIS_VNNI_Z(i) TRELLIS_VNNI_Z(i) TRELLIS_VNNI_Z(i) TRELLIS_VNNI_Z(i) \
  TRELLIS_VNNI_Z(i) TRELLIS_VNNI_Z(i) TRELLIS_VNNI_Z(i) TRELLIS_VNNI_Z(i)
#define TRELLIS_SCALE_Z(i, f, ta, tb)                 \
  "vcvtdq2ps %%zmm" #i ", %%zmm" #ta "\n\t"          \
  "vmulps %[s], %[d], %%zmm" #tb "\n\t"              \
  "vfmadd231ps %%zmm" #ta ", %%zmm" #tb ", %%zmm" #f "\n\t"
__attribute__((target("avx512f,avx512vnni"))) void VnniTileMixZmm(int64_t n) {
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-5);
  const __m512 s = _mm512_set1_ps(1e-3f), d = _mm512_set1_ps(1.0f);
  __m512i out;
  asm volatile(TRELLIS_R16(TRELLIS_ZERO_Z) "1:\n\t" TRELLIS_DP8_Z(0) TRELLIS_DP8_Z(1) TRELLIS_DP8_Z(2)
                   TRELLIS_DP8_Z(3) TRELLIS_DP8_Z(4) TRELLIS_DP8_Z(5) TRELLIS_DP8_Z(6) TRELLIS_DP8_Z(7)
                       TRELLIS_SCALE_Z(0, 8, 16, 17) TRELLIS_SCALE_Z(1, 9, 18, 19) TRELLIS_SCALE_Z(2, 10, 20, 21)
                           TRELLIS_SCALE_Z(3, 11, 22, 23) TRELLIS_SCALE_Z(4, 12, 16, 17) TRELLIS_SCALE_Z(5, 13, 18, 19)
                               TRELLIS_SCALE_Z(6, 14, 20, 21) TRELLIS_SCALE_Z(7, 15, 22, 23) "dec %[n]\n\t"
                                                                                         "jnz 1b\n\t" TRELLIS_R1_15(
                                                                                             TRELLIS_FOLD_Z) "vmovdqu64 %%zmm0, %[out]"
               : [n] "+r"(n), [out] "=m"(out)
               : [x] "v"(x), [y] "v"(y), [s] "v"(s), [d] "v"(d)
               : TRELLIS_ZMM_CLOBBERS, "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
  SinkZmm(out);
}

// Which instructions share vpdpbusd's pipes: 16 vpdpbusd (zmm0..15, as VnniZmm) plus 8
// independent OP into zmm16..23 per iteration, counted as the 2048 int8 ops of the
// vpdpbusd alone. Where OP runs on other pipes the rate is int8_dot's; where it takes the
// same ones (two on Zen 4 / 5: 24 instructions for 16 slots) it is 2/3 of it. The packed
// tiles' ceilings follow from how many such instructions they spend per vpdpbusd
// (docs/ROOFLINE.md, "Which instructions share the int8 dot's pipes").
#define TRELLIS_ZERO_HI(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
#define TRELLIS_R16_23(X) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
#define TRELLIS_PORT_LOOP(NAME, OP)                                                                     \
  __attribute__((target("avx512f,avx512vnni,avx512bw"))) void NAME(int64_t n) {                       \
    const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-5);                                   \
    __m512i out;                                                                                         \
    asm volatile(TRELLIS_R16(TRELLIS_ZERO_Z) TRELLIS_R16_23(TRELLIS_ZERO_HI) "1:\n\t" TRELLIS_R16(       \
        TRELLIS_VNNI_Z) TRELLIS_R16_23(OP) "dec %[n]\n\t"                                                \
                                          "jnz 1b\n\t" TRELLIS_R1_15(TRELLIS_FOLD_Z) "vmovdqu64 %%zmm0, %[out]" \
                 : [n] "+r"(n), [out] "=m"(out)                                                         \
                 : [x] "v"(x), [y] "v"(y)                                                               \
                 : TRELLIS_ZMM_CLOBBERS, "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23"); \
    SinkZmm(out);                                                                                        \
  }
#define TRELLIS_OP_MUL(i) "vmulps %[y], %[x], %%zmm" #i "\n\t"
#define TRELLIS_OP_FMA(i) "vfmadd231ps %[y], %[x], %%zmm" #i "\n\t"
#define TRELLIS_OP_MULLD(i) "vpmulld %[y], %[x], %%zmm" #i "\n\t"
#define TRELLIS_OP_DPWSSD(i) "vpdpwssd %[y], %[x], %%zmm" #i "\n\t"
#define TRELLIS_OP_CVT(i) "vcvtdq2ps %[x], %%zmm" #i "\n\t"
#define TRELLIS_OP_ADD(i) "vpaddd %[y], %[x], %%zmm" #i "\n\t"
TRELLIS_PORT_LOOP(VnniWithMul, TRELLIS_OP_MUL)
TRELLIS_PORT_LOOP(VnniWithFma, TRELLIS_OP_FMA)
TRELLIS_PORT_LOOP(VnniWithMulld, TRELLIS_OP_MULLD)
TRELLIS_PORT_LOOP(VnniWithDpwssd, TRELLIS_OP_DPWSSD)
TRELLIS_PORT_LOOP(VnniWithCvt, TRELLIS_OP_CVT)
TRELLIS_PORT_LOOP(VnniWithAdd, TRELLIS_OP_ADD)

// Where a packed tile's activation dwords come from (kernels/packed_avx512.cc,
// TilePackedGroups): 16 vpdpbusd per iteration against 2 zmm loads of a weight stream
// (zmm16 / 17, the other operand), each vpdpbusd's dword either broadcast from memory
// ({1to16}, at the one-group tile's offsets: 8 tokens 32 bytes apart, 4 lines) or, as
// the two-group tiles do, 8 dwords broadcast into registers once and each used by two
// vpdpbusd. Both walk 16 KiB of L1 (activations) and 16 KiB (weights), 320 bytes an
// iteration. The int8 dot's register-operand rate is the reference.
alignas(64) uint8_t g_tile_bytes[32768];
#define TRELLIS_TILE_BYTES_LOOP(NAME, BODY)                                                           \
  __attribute__((target("avx512f,avx512vnni"))) void NAME(int64_t n) {                                \
    const uint8_t* a = g_tile_bytes;                                                                    \
    const uint8_t* w = g_tile_bytes + 16384;                                                            \
    int64_t o = 0;                                                                                      \
    __m512i out;                                                                                        \
    asm volatile(TRELLIS_R16(TRELLIS_ZERO_Z) "1:\n\t"                                                  \
                 "vmovdqa64 (%[w],%[o]), %%zmm16\n\t"                                                  \
                 "vmovdqa64 64(%[w],%[o]), %%zmm17\n\t" BODY "add $320, %[o]\n\t"                      \
                 "and $16383, %[o]\n\t"                                                                \
                 "dec %[n]\n\t"                                                                        \
                 "jnz 1b\n\t" TRELLIS_R1_15(TRELLIS_FOLD_Z) "vmovdqu64 %%zmm0, %[out]"                   \
                 : [n] "+r"(n), [o] "+r"(o), [out] "=m"(out)                                            \
                 : [a] "r"(a), [w] "r"(w)                                                               \
                 : TRELLIS_ZMM_CLOBBERS, "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", \
                   "xmm24", "xmm25", "memory");                                                         \
    SinkZmm(out);                                                                                       \
  }
#define TRELLIS_BCAST_OPERANDS \
  "vpdpbusd 0(%[a],%[o])%{1to16%}, %%zmm16, %%zmm0\n\t" \
  "vpdpbusd 32(%[a],%[o])%{1to16%}, %%zmm16, %%zmm1\n\t" \
  "vpdpbusd 64(%[a],%[o])%{1to16%}, %%zmm16, %%zmm2\n\t" \
  "vpdpbusd 96(%[a],%[o])%{1to16%}, %%zmm16, %%zmm3\n\t" \
  "vpdpbusd 128(%[a],%[o])%{1to16%}, %%zmm16, %%zmm4\n\t" \
  "vpdpbusd 160(%[a],%[o])%{1to16%}, %%zmm16, %%zmm5\n\t" \
  "vpdpbusd 192(%[a],%[o])%{1to16%}, %%zmm16, %%zmm6\n\t" \
  "vpdpbusd 224(%[a],%[o])%{1to16%}, %%zmm16, %%zmm7\n\t" \
  "vpdpbusd 4(%[a],%[o])%{1to16%}, %%zmm17, %%zmm8\n\t" \
  "vpdpbusd 36(%[a],%[o])%{1to16%}, %%zmm17, %%zmm9\n\t" \
  "vpdpbusd 68(%[a],%[o])%{1to16%}, %%zmm17, %%zmm10\n\t" \
  "vpdpbusd 100(%[a],%[o])%{1to16%}, %%zmm17, %%zmm11\n\t" \
  "vpdpbusd 132(%[a],%[o])%{1to16%}, %%zmm17, %%zmm12\n\t" \
  "vpdpbusd 164(%[a],%[o])%{1to16%}, %%zmm17, %%zmm13\n\t" \
  "vpdpbusd 196(%[a],%[o])%{1to16%}, %%zmm17, %%zmm14\n\t" \
  "vpdpbusd 228(%[a],%[o])%{1to16%}, %%zmm17, %%zmm15\n\t"
#define TRELLIS_BCAST_PAIRS \
  "vpbroadcastd 0(%[a],%[o]), %%zmm18\n\t" \
  "vpdpbusd %%zmm18, %%zmm16, %%zmm0\n\t" \
  "vpdpbusd %%zmm18, %%zmm17, %%zmm8\n\t" \
  "vpbroadcastd 32(%[a],%[o]), %%zmm19\n\t" \
  "vpdpbusd %%zmm19, %%zmm16, %%zmm1\n\t" \
  "vpdpbusd %%zmm19, %%zmm17, %%zmm9\n\t" \
  "vpbroadcastd 64(%[a],%[o]), %%zmm20\n\t" \
  "vpdpbusd %%zmm20, %%zmm16, %%zmm2\n\t" \
  "vpdpbusd %%zmm20, %%zmm17, %%zmm10\n\t" \
  "vpbroadcastd 96(%[a],%[o]), %%zmm21\n\t" \
  "vpdpbusd %%zmm21, %%zmm16, %%zmm3\n\t" \
  "vpdpbusd %%zmm21, %%zmm17, %%zmm11\n\t" \
  "vpbroadcastd 4(%[a],%[o]), %%zmm22\n\t" \
  "vpdpbusd %%zmm22, %%zmm16, %%zmm4\n\t" \
  "vpdpbusd %%zmm22, %%zmm17, %%zmm12\n\t" \
  "vpbroadcastd 36(%[a],%[o]), %%zmm23\n\t" \
  "vpdpbusd %%zmm23, %%zmm16, %%zmm5\n\t" \
  "vpdpbusd %%zmm23, %%zmm17, %%zmm13\n\t" \
  "vpbroadcastd 68(%[a],%[o]), %%zmm24\n\t" \
  "vpdpbusd %%zmm24, %%zmm16, %%zmm6\n\t" \
  "vpdpbusd %%zmm24, %%zmm17, %%zmm14\n\t" \
  "vpbroadcastd 100(%[a],%[o]), %%zmm25\n\t" \
  "vpdpbusd %%zmm25, %%zmm16, %%zmm7\n\t" \
  "vpdpbusd %%zmm25, %%zmm17, %%zmm15\n\t"
TRELLIS_TILE_BYTES_LOOP(VnniBroadcastOperands, TRELLIS_BCAST_OPERANDS)
TRELLIS_TILE_BYTES_LOOP(VnniBroadcastPairs, TRELLIS_BCAST_PAIRS)

// 16 x vdpbf16ps zmm: 16 x 32 bf16 pairs x 2 = 1024 FLOP per iteration.
__attribute__((target("avx512f,avx512bf16"))) void Bf16Zmm(int64_t n) {
  const __m512i x = _mm512_set1_epi16(0x3f80), y = _mm512_set1_epi16(0x33d6);  // bf16 1.0, 1e-7
  __m512i out;
  asm volatile(TRELLIS_ZMM_LOOP(TRELLIS_BF16_Z) : [n] "+r"(n), [out] "=m"(out) : [x] "v"(x), [y] "v"(y)
               : TRELLIS_ZMM_CLOBBERS);
  SinkZmm(out);
}

// 12 x vfmadd231ps ymm (16 ymm registers: 12 accumulators + 2 sources): 192 FLOP.
__attribute__((target("avx2,fma"))) void FmaYmm(int64_t n) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-7f);
  asm volatile("1:\n\t" TRELLIS_R12(TRELLIS_FMA) "dec %[n]\n\t"
               "jnz 1b"
               : TRELLIS_R12(TRELLIS_ACC)[n] "+r"(n)
               : [x] "v"(x), [y] "v"(y)
               : "cc");
  SinkYmm(reinterpret_cast<const __m256i*>(acc), 12);
}

// 12 x {vex} vpdpbusd ymm (AVX-VNNI): 12 x 32 x 2 = 768 ops per iteration.
__attribute__((target("avx2,avxvnni"))) void VnniYmm(int64_t n) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-5);
  asm volatile("1:\n\t" TRELLIS_R12(TRELLIS_VEX_VNNI) "dec %[n]\n\t"
               "jnz 1b"
               : TRELLIS_R12(TRELLIS_ACC)[n] "+r"(n)
               : [x] "v"(x), [y] "v"(y)
               : "cc");
  SinkYmm(acc, 12);
}

// 6 chains of vpmaddubsw + vpmaddwd + vpaddd ymm: 6 x 32 x 2 = 384 ops per iteration
// (6 accumulators + 6 temporaries + 3 sources = 15 of the 16 ymm registers).
__attribute__((target("avx2"))) void MaddubsYmm(int64_t n) {
  __m256i acc[6], tmp[6];
  for (int i = 0; i < 6; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-5), one = _mm256_set1_epi16(1);
  asm volatile("1:\n\t" TRELLIS_R6(TRELLIS_MADDUBS) "dec %[n]\n\t"
               "jnz 1b"
               : TRELLIS_R6(TRELLIS_ACC) TRELLIS_R6(TRELLIS_TMP)[n] "+r"(n)
               : [x] "v"(x), [y] "v"(y), [one] "v"(one)
               : "cc");
  SinkYmm(acc, 6);
}

// 16 dependent `add $1` per iteration: 16 cycles per iteration at any width.
void ClockAdds(int64_t n) {
  uint64_t c = 0;
  asm volatile("1:\n\t" TRELLIS_R16(TRELLIS_ADD1) "dec %[n]\n\t"
               "jnz 1b"
               : [c] "+r"(c), [n] "+r"(n)
               :
               : "cc");
  g_sink = g_sink + c;
}

// ---- Timing -------------------------------------------------------------------------

// Runs work(t) on `threads` threads (the caller is thread 0), warmups + reps times; the
// first `warmups` are not timed. Returns each timed repetition's seconds: from the
// barrier that releases every thread to the barrier where the last one is done.
std::vector<double> TimeReps(int threads, int reps, const std::function<void(int)>& work, int warmups = 1) {
  std::barrier sync(threads);
  std::vector<double> secs;
  auto body = [&](int t) {
    for (int r = 0; r < warmups + reps; ++r) {
      sync.arrive_and_wait();
      const double t0 = NowSeconds();
      work(t);
      sync.arrive_and_wait();
      if (t == 0 && r >= warmups) secs.push_back(NowSeconds() - t0);
    }
  };
  std::vector<std::thread> ts;
  for (int t = 1; t < threads; ++t) ts.emplace_back(body, t);
  body(0);
  for (auto& th : ts) th.join();
  return secs;
}

struct Figure {
  std::string key;   // dram_read_zmm (_ymm, _scalar), l2_read_*, int8_dot, f32_fma, bf16_dot, clock
  std::string what;  // human description, no commas (it goes into the CSV)
  std::string unit;
  int threads = 1;
  double value = 0;  // median over repetitions
  std::vector<double> runs;
};

struct PeakLoop {
  std::string key, what, unit;
  void (*fn)(int64_t);
  double ops_per_iter;  // counted ops (or cycles for the clock) per loop iteration
};

// Iterations so that one call takes about `seconds` on one thread.
int64_t Calibrate(void (*fn)(int64_t), double seconds) {
  fn(1 << 12);  // wake the unit up (AVX-512 power state, caches)
  int64_t n = 1 << 14;
  for (;;) {
    const double t0 = NowSeconds();
    fn(n);
    const double dt = NowSeconds() - t0;
    if (dt > seconds / 8 || n >= (int64_t{1} << 40)) {
      return std::max<int64_t>(1024, static_cast<int64_t>(static_cast<double>(n) * seconds / std::max(dt, 1e-9)));
    }
    n *= 4;
  }
}

Figure MeasurePeak(const PeakLoop& k, int threads, int64_t iters, int reps) {
  Figure f{k.key, k.what, k.unit, threads, 0, {}};
  const std::vector<double> secs = TimeReps(threads, reps, [&](int) { k.fn(iters); });
  // The clock is a per-core rate; every other peak adds over the threads.
  const double total = k.ops_per_iter * static_cast<double>(iters) * (k.key == "clock" ? 1 : threads);
  for (double s : secs) f.runs.push_back(total / s * 1e-9);
  f.value = Median(f.runs);
  return f;
}

// ---- Ceilings for the TinyLlama shape -----------------------------------------------

struct ModelCost {
  std::string name;
  double bytes;    // weight bytes one decode step reads
  double macs;     // matmul multiply-adds per token
  bool int8;       // quantized: prefill dot products run on int8 (else f32 FMA)
};

// llama.cpp's Q4_K_M rule (as gen-model applies it): layers whose attn_v and ffn_down are Q6_K.
bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

std::vector<ModelCost> TinyLlamaCosts() {
  const ModelShape s = *ModelShapeByName("tinyllama");
  const double E = s.n_embd, F = s.n_ff, V = 32000;            // LLaMA SPM vocab
  const double KD = static_cast<double>(s.n_head_kv) * (E / s.n_head);  // K and V width
  // Per layer: wq, wo E x E; wk, wv E x KD; gate, up, down E x F. Then output E x V.
  const double q_o = 2 * E * E, k = E * KD, v = E * KD, gate_up = 2 * E * F, down = E * F;
  const double layer = q_o + k + v + gate_up + down, output = E * V;
  const double macs = s.n_layer * layer + output;
  // Bytes per weight: Q4_0 18 per 32, Q4_K 144 per 256, Q6_K 210 per 256, F16 2.
  const double q4_0 = 18.0 / 32, q4_k = 144.0 / 256, q6_k = 210.0 / 256, f16 = 2;
  // Q4_0 as llama-quantize writes it keeps output.weight in Q6_K.
  const double q4_0_bytes = s.n_layer * layer * q4_0 + output * q6_k;
  // Q4_K_M: Q4_K everywhere except attn_v and ffn_down in UseMoreBits layers, and output, in Q6_K.
  double q4_k_m_bytes = output * q6_k;
  for (int i = 0; i < s.n_layer; ++i) {
    q4_k_m_bytes += (q_o + k + gate_up) * q4_k + (v + down) * (UseMoreBits(i, s.n_layer) ? q6_k : q4_k);
  }
  return {{"Q4_0", q4_0_bytes, macs, true}, {"Q4_K_M", q4_k_m_bytes, macs, true}, {"F16", macs * f16, macs, false}};
}

// Tokens/s of b sessions decoding together: one read of the weights per step for b
// tokens, or b tokens of arithmetic, whichever takes longer (b = 1: plain decode).
double DecodeCeiling(const ModelCost& m, double bytes_per_s, double ops_per_s, int b) {
  if (bytes_per_s <= 0) return 0;
  const double read = m.bytes / bytes_per_s;
  const double compute = ops_per_s > 0 ? b * 2 * m.macs / ops_per_s : 0;
  return b / std::max(read, compute);
}

// Every figure for 1 thread and o.threads (only_threads: for o.threads alone), medians of
// `reps` repetitions.
Result<std::vector<Figure>> MeasureFigures(const RooflineBenchOptions& o, const Paths& p, int reps,
                                           bool only_threads = false) {
  const double peak_seconds = o.quick ? 0.004 : 0.02;  // one repetition of a peak loop
  const size_t dram_bytes = (o.quick ? size_t{64} : size_t{512}) << 20;
  const size_t l2_bytes = 256 << 10;
  const int l2_passes = o.quick ? 128 : 4096;

  std::vector<int> thread_counts;
  if (!only_threads || o.threads == 1) thread_counts.push_back(1);
  if (o.threads > 1) thread_counts.push_back(o.threads);
  std::vector<Figure> figs;

  // Bandwidth. With AVX-512, zmm and ymm loads both: on the Zen 5 of docs/ROOFLINE.md
  // ymm loads read an L2-resident buffer ~1.8x faster than zmm loads, so the machine's
  // limit is the better of the two. Repetitions alternate between the widths.
  struct Reader {
    const char* loads;
    uint64_t (*fn)(const uint8_t*, size_t);
  };
  std::vector<Reader> readers;
  if (p.avx512) readers.push_back({"zmm", ReadZmm});
  if (p.avx2) readers.push_back({"ymm", ReadYmm});
  if (readers.empty()) readers.push_back({"scalar", ReadScalar});
  void* dram = mmap(nullptr, dram_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (dram == MAP_FAILED) return Failure(fmt::format("bench roofline: cannot map {} MiB", dram_bytes >> 20));
  madvise(dram, dram_bytes, MADV_HUGEPAGE);  // fewer TLB misses; a hint, may be ignored
  auto* buf = static_cast<uint8_t*>(dram);
  // Written (not just mapped: untouched pages all read the one zero page, from cache).
  TimeReps(o.threads, 0, [&](int t) {
    const size_t a = dram_bytes * t / o.threads, b = dram_bytes * (t + 1) / o.threads;
    std::memset(buf + a, 1 + t, b - a);
  });
  std::vector<std::vector<uint8_t>> l2(static_cast<size_t>(o.threads));
  std::vector<uint8_t*> l2_buf(static_cast<size_t>(o.threads));
  for (size_t t = 0; t < l2.size(); ++t) {
    l2[t].assign(l2_bytes + 64, static_cast<uint8_t>(t + 1));
    l2_buf[t] = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(l2[t].data()) + 63) & ~uintptr_t{63});
  }
  for (int n : thread_counts) {
    const size_t first = figs.size();
    for (const Reader& r : readers) {
      figs.push_back({fmt::format("dram_read_{}", r.loads),
                      fmt::format("DRAM read ({} MiB {} loads)", dram_bytes >> 20, r.loads), "GB/s", n, 0, {}});
    }
    for (const Reader& r : readers) {
      figs.push_back({fmt::format("l2_read_{}", r.loads), fmt::format("L2 read (256 KiB per thread {} loads)", r.loads),
                      "GB/s", n, 0, {}});
    }
    const size_t nr = readers.size();
    for (int rep = 0; rep < reps; ++rep) {
      for (size_t i = 0; i < nr; ++i) {
        const auto read = readers[i].fn;
        // Each thread its own contiguous part of the buffer, cut at 512-byte boundaries.
        const double s = TimeReps(n, 1, [&](int t) {
          const size_t a = dram_bytes / 512 * t / n * 512, b = dram_bytes / 512 * (t + 1) / n * 512;
          g_sink = g_sink + read(buf + a, b - a);
        }, rep == 0)[0];
        figs[first + i].runs.push_back(static_cast<double>(dram_bytes) / s * 1e-9);
      }
      for (size_t i = 0; i < nr; ++i) {
        const auto read = readers[i].fn;
        const double s = TimeReps(n, 1, [&](int t) {
          uint64_t sum = 0;
          for (int k = 0; k < l2_passes; ++k) sum += read(l2_buf[static_cast<size_t>(t)], l2_bytes);
          g_sink = g_sink + sum;
        }, rep == 0)[0];
        figs[first + nr + i].runs.push_back(static_cast<double>(l2_bytes) * l2_passes * n / s * 1e-9);
      }
    }
    for (size_t i = first; i < figs.size(); ++i) figs[i].value = Median(figs[i].runs);
  }
  munmap(dram, dram_bytes);

  // Arithmetic peaks.
  std::vector<PeakLoop> loops;
  if (p.vnni512) {
    loops.push_back({"int8_dot", "int8 dot (vpdpbusd zmm x16 chains)", "GOP/s", VnniZmm, 16 * 64 * 2});
    loops.push_back({"int8_tile_mix", "int8 dot in the Q4_0 / Q8_0 tiles' mix (8 x (8 vpdpbusd, cvt, mul, fma))",
                     "GOP/s", VnniTileMixZmm, 64 * 64 * 2});
  } else if (p.avxvnni) {
    loops.push_back({"int8_dot", "int8 dot ({vex} vpdpbusd ymm x12 chains)", "GOP/s", VnniYmm, 12 * 32 * 2});
  } else if (p.avx2) {
    loops.push_back({"int8_dot", "int8 dot (vpmaddubsw+vpmaddwd+vpaddd ymm x6 chains)", "GOP/s", MaddubsYmm, 6 * 32 * 2});
  }
  if (p.avx512) {
    loops.push_back({"f32_fma", "f32 FMA (vfmadd231ps zmm x16 chains)", "GFLOP/s", FmaZmm, 16 * 16 * 2});
  } else if (p.avx2) {
    loops.push_back({"f32_fma", "f32 FMA (vfmadd231ps ymm x12 chains)", "GFLOP/s", FmaYmm, 12 * 8 * 2});
  }
  if (p.bf16_512) {
    loops.push_back({"bf16_dot", "bf16 dot (vdpbf16ps zmm x16 chains)", "GFLOP/s", Bf16Zmm, 16 * 32 * 2});
  }
  const PeakLoop clock{"clock", "core clock (16 dependent adds per loop)", "GHz", ClockAdds, 16};
  for (const PeakLoop& k : loops) {
    const int64_t iters = Calibrate(k.fn, peak_seconds);
    for (int n : thread_counts) figs.push_back(MeasurePeak(k, n, iters, reps));
  }
  if (p.vnni512 && !only_threads) {  // one core's pipes: 1 thread; not part of --limits
    const PeakLoop shares[] = {
        {"int8_with_vmulps", "int8 dot with 8 vmulps per 16 vpdpbusd", "GOP/s", VnniWithMul, 16 * 64 * 2},
        {"int8_with_vfmadd231ps", "int8 dot with 8 vfmadd231ps per 16 vpdpbusd", "GOP/s", VnniWithFma, 16 * 64 * 2},
        {"int8_with_vpmulld", "int8 dot with 8 vpmulld per 16 vpdpbusd", "GOP/s", VnniWithMulld, 16 * 64 * 2},
        {"int8_with_vpdpwssd", "int8 dot with 8 vpdpwssd per 16 vpdpbusd", "GOP/s", VnniWithDpwssd, 16 * 64 * 2},
        {"int8_with_vcvtdq2ps", "int8 dot with 8 vcvtdq2ps per 16 vpdpbusd", "GOP/s", VnniWithCvt, 16 * 64 * 2},
        {"int8_with_vpaddd", "int8 dot with 8 vpaddd per 16 vpdpbusd", "GOP/s", VnniWithAdd, 16 * 64 * 2},
        {"int8_bcast_operands", "int8 dot, dwords as broadcast memory operands (4 lines), 2 zmm loads per 16", "GOP/s",
         VnniBroadcastOperands, 16 * 64 * 2},
        {"int8_bcast_pairs", "int8 dot, 8 dwords broadcast to registers for 2 vpdpbusd each, 2 zmm loads per 16",
         "GOP/s", VnniBroadcastPairs, 16 * 64 * 2},
    };
    for (const PeakLoop& k : shares) figs.push_back(MeasurePeak(k, 1, Calibrate(k.fn, peak_seconds), reps));
  }
  figs.push_back(MeasurePeak(clock, 1, Calibrate(clock.fn, peak_seconds), reps));
  return figs;
}

// The best figure whose key starts with `key` (dram_read: over the load widths).
double BestFigure(const std::vector<Figure>& figs, const std::string& key, int n) {
  double best = 0;
  for (const Figure& f : figs) {
    if (f.key.rfind(key, 0) == 0 && f.threads == n) best = std::max(best, f.value);
  }
  return best;
}

Status Run(const RooflineBenchOptions& o) {
  const Paths p = ChoosePaths();
  const int reps = o.quick ? 3 : 7;
  TRELLIS_ASSIGN_OR_RETURN(std::vector<Figure> figs, MeasureFigures(o, p, reps));
  std::vector<int> thread_counts = {1};
  if (o.threads > 1) thread_counts.push_back(o.threads);

  auto find = [&](const std::string& key, int n) { return BestFigure(figs, key, n); };

  // Ceilings.
  struct Ceiling {
    std::string model;
    int threads;
    double mb, gop, tg, pp, decode8;
  };
  std::vector<Ceiling> ceilings;
  for (const ModelCost& m : TinyLlamaCosts()) {
    for (int n : thread_counts) {
      const double bw = find("dram_read", n) * 1e9;
      const double peak = find(m.int8 ? "int8_dot" : "f32_fma", n) * 1e9;
      ceilings.push_back({m.name, n, m.bytes * 1e-6, 2 * m.macs * 1e-9, DecodeCeiling(m, bw, peak, 1),
                          peak / (2 * m.macs), DecodeCeiling(m, bw, peak, 8)});
    }
  }

  const char* isa = p.avx512 ? "avx512" : p.avx2 ? "avx2" : "scalar";
  if (o.json) {
    for (const Figure& f : figs) {
      nlohmann::json j = {{"bench", "roofline"}, {"kind", "peak"}, {"what", f.key}, {"how", f.what},
                          {"threads", f.threads}, {"value", f.value}, {"unit", f.unit}, {"isa", isa},
                          {"reps", reps}, {"runs", f.runs}};
      std::printf("%s\n", j.dump().c_str());
    }
    for (const Ceiling& c : ceilings) {
      nlohmann::json j = {{"bench", "roofline"}, {"kind", "ceiling"}, {"model", "tinyllama-" + c.model},
                          {"threads", c.threads}, {"weight_mb_per_token", c.mb}, {"gop_per_token", c.gop},
                          {"tg_tok_s", c.tg}, {"pp_tok_s", c.pp}, {"decode8_tok_s", c.decode8}};
      std::printf("%s\n", j.dump().c_str());
    }
  } else {
    std::printf("| what | threads | figure (median of %d) | unit |\n|---|---|---|---|\n", reps);
    for (const Figure& f : figs) {
      std::printf("| %s | %d | %.1f | %s |\n", f.what.c_str(), f.threads, f.value, f.unit.c_str());
    }
    std::printf("\nCeilings, TinyLlama shape (decode: DRAM read / weight bytes; prefill: int8 peak (F16: f32 FMA "
                "peak) / 2 MACs; 8 sessions: 8 / max(bytes / DRAM read, 8 x 2 MACs / peak))\n\n");
    std::printf("| model | threads | weights read per token MB | GOP per token | decode tok/s | prefill tok/s | "
                "8 sessions decode tok/s |\n|---|---|---|---|---|---|---|\n");
    for (const Ceiling& c : ceilings) {
      std::printf("| %s | %d | %.1f | %.3f | %.1f | %.0f | %.0f |\n", c.model.c_str(), c.threads, c.mb, c.gop,
                  c.tg, c.pp, c.decode8);
    }
  }
  std::fflush(stdout);
  if (!o.csv.empty()) {
    std::ofstream f(o.csv, std::ios::app);
    if (f.tellp() == 0) f << "kind,what,threads,value,unit,isa,detail\n";
    for (const Figure& x : figs) {
      f << "peak," << x.key << "," << x.threads << "," << x.value << "," << x.unit << "," << isa << "," << x.what << "\n";
    }
    for (const Ceiling& c : ceilings) {
      const std::string detail = fmt::format("{:.1f} MB per token {:.3f} GOP per token", c.mb, c.gop);
      f << "ceiling,tg_" << c.model << "," << c.threads << "," << c.tg << ",tok/s," << isa << "," << detail << "\n";
      f << "ceiling,pp_" << c.model << "," << c.threads << "," << c.pp << ",tok/s," << isa << "," << detail << "\n";
      f << "ceiling,decode8_" << c.model << "," << c.threads << "," << c.decode8 << ",tok/s," << isa << "," << detail
        << "\n";
    }
    if (!f) return Failure("cannot write " + o.csv);
  }
  return Status::Ok();
}

}  // namespace


Status RunRooflineBench(const RooflineBenchOptions& o) {
  if (o.threads < 1 || o.threads > 256) return Failure("bench roofline: --threads must be in 1..256");
  return Run(o);
}

Result<MachineLimits> MeasureLimits(int threads, bool quick) {
  if (threads < 1 || threads > 256) return Failure("limits: threads must be in 1..256");
  RooflineBenchOptions o;
  o.threads = threads;
  o.quick = quick;
  const Paths p = ChoosePaths();
  TRELLIS_ASSIGN_OR_RETURN(std::vector<Figure> figs, MeasureFigures(o, p, quick ? 3 : 5, /*only_threads=*/true));
  MachineLimits m;
  m.int8_ops = BestFigure(figs, "int8_dot", threads) * 1e9;
  m.f32_flops = BestFigure(figs, "f32_fma", threads) * 1e9;
  m.dram_bytes = BestFigure(figs, "dram_read", threads) * 1e9;
  m.clock_hz = BestFigure(figs, "clock", 1) * 1e9;
  return m;
}

}  // namespace trellis::bench
