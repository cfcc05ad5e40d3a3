#include "kernels/cpu_features.h"

#if TRELLIS_X86
#include <cpuid.h>
#endif
#if TRELLIS_ARM64
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <mutex>
#include <initializer_list>

namespace trellis {
namespace {

#if TRELLIS_X86
uint64_t ReadXcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c >> 27) & 1;
  const bool fma = (c >> 12) & 1;
  const bool f16c = (c >> 29) & 1;
  const bool avx = (c >> 28) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;            // SSE + AVX state
  const bool zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0;  // opmask + ZMM hi/lo
  if (!ymm_state) return f;

  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = (b >> 5) & 1;
  f.fma = fma;
  f.f16c = f16c;
  if (zmm_state) {
    f.avx512f = (b >> 16) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512vnni = (c >> 11) & 1;
  }
  __cpuid_count(7, 1, a, b, c, d);
  f.avxvnni = (a >> 4) & 1;
  if (zmm_state) f.avx512bf16 = (a >> 5) & 1;
  return f;
}

// cpuid traps to the hypervisor in a VM (microseconds), and MatMul asks on every call:
// read it once.
bool HasAvx512Dq() {
  static const bool dq = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    __cpuid_count(7, 0, a, b, c, d);
    return ((b >> 17) & 1) != 0;
  }();
  return dq;
}

#elif TRELLIS_ARM64
CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.neon = (hw & HWCAP_ASIMD) != 0;
  f.neon_dotprod = (hw & HWCAP_ASIMDDP) != 0;
  f.neon_fp16 = (hw & HWCAP_ASIMDHP) != 0;
#ifdef HWCAP2_I8MM
  f.neon_i8mm = (hw2 & HWCAP2_I8MM) != 0;
#endif
#ifdef HWCAP2_BF16
  f.neon_bf16 = (hw2 & HWCAP2_BF16) != 0;
#endif
  (void)hw2;
  return f;
}

bool HasAvx512Dq() { return false; }
#else
CpuFeatures DetectCpuFeatures() { return {}; }
bool HasAvx512Dq() { return false; }
#endif

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = DetectCpuFeatures();
  return features;
}

bool IsaSupported(KernelIsa isa) {
  const CpuFeatures& f = GetCpuFeatures();
  switch (isa) {
    case KernelIsa::kScalar:
      return true;
    case KernelIsa::kAvx2:
      return f.avx2 && f.fma && f.f16c;
    case KernelIsa::kAvx512:
      return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni &&
             f.avx512bf16 && HasAvx512Dq();
    case KernelIsa::kNeon:
      return TRELLIS_ARM64 && f.neon;
  }
  return false;
}

const char* KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar: return "scalar";
    case KernelIsa::kAvx2: return "avx2";
    case KernelIsa::kAvx512: return "avx512";
    case KernelIsa::kNeon: return "neon";
  }
  return "?";
}

namespace {

std::mutex g_choice_mu;
KernelChoice g_choice;            // under g_choice_mu until fixed
std::atomic<bool> g_fixed{false};  // a kernel was chosen: g_choice is read-only now

const KernelChoice& FixChoice() {
  if (!g_fixed.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_choice_mu);
    g_fixed.store(true, std::memory_order_release);
  }
  return g_choice;
}

bool Off(const char* v) { return v != nullptr && std::strcmp(v, "0") == 0; }

}  // namespace

bool ChooseKernels(const KernelChoice& choice) {
  std::lock_guard<std::mutex> lock(g_choice_mu);
  if (g_fixed.load(std::memory_order_acquire)) return false;
  g_choice = choice;
  return true;
}

const KernelChoice& ChosenKernels() { return FixChoice(); }

KernelChoice KernelChoiceFromValues(const char* isa, const char* avxvnni, const char* neon_dotprod, const char* repack) {
  KernelChoice c;
  if (isa != nullptr && std::strcmp(isa, "scalar") == 0) c.cap = KernelIsa::kScalar;
  if (isa != nullptr && std::strcmp(isa, "avx2") == 0) c.cap = KernelIsa::kAvx2;
  c.avxvnni = !Off(avxvnni);
  c.neon_dotprod = !Off(neon_dotprod);
  c.repack = !Off(repack);
  return c;
}

bool AvxVnniEnabled() {
  static const bool use = GetCpuFeatures().avxvnni && FixChoice().avxvnni;
  return use;
}

bool NeonDotprodEnabled() {
  static const bool use = GetCpuFeatures().neon_dotprod && FixChoice().neon_dotprod;
  return use;
}

const char* KernelPathName() {
  switch (BestKernelIsa()) {
    case KernelIsa::kAvx512: return "avx512 (VNNI, BF16)";
    case KernelIsa::kAvx2: return AvxVnniEnabled() ? "avx2 (AVX-VNNI)" : "avx2 (no VNNI)";
    case KernelIsa::kNeon: return NeonDotprodEnabled() ? "neon (dotprod)" : "neon (no dotprod)";
    case KernelIsa::kScalar: return "scalar";
  }
  return "?";
}

KernelIsa BestKernelIsa() {
  static const KernelIsa best = [] {
    // Widest first; the choice's cap names where to start (scalar: none of them).
    std::initializer_list<KernelIsa> order = {KernelIsa::kAvx512, KernelIsa::kAvx2, KernelIsa::kNeon};
    const KernelIsa* from = order.begin();
    const std::optional<KernelIsa> cap = FixChoice().cap;
    if (cap == KernelIsa::kScalar) from = order.end();
    else if (cap == KernelIsa::kAvx2) from = order.begin() + 1;
    for (const KernelIsa* isa = from; isa != order.end(); ++isa) {
      if (IsaSupported(*isa)) return *isa;
    }
    return KernelIsa::kScalar;
  }();
  return best;
}

}  // namespace trellis
