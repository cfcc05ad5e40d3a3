// CPU feature detection and the choice of SIMD kernel family.
//
// x86-64: GetCpuFeatures() reads cpuid and xgetbv once (the OS must enable the AVX /
// AVX-512 register state, not just the CPU advertise it). aarch64: the kernel's hwcaps
// (getauxval), NEON always (Advanced SIMD is part of ARMv8-A), dotprod, i8mm, fp16 and
// bf16 where the CPU has them. BestKernelIsa() picks the widest kernel family the CPU
// runs, capped by the program's KernelChoice (a request above what the CPU has is
// lowered to what it has). Libraries read no environment: the `trellis` binary (cli/)
// and the test mains turn TRELLIS_ISA=scalar|avx2|avx512|neon, TRELLIS_AVXVNNI=0,
// TRELLIS_NEON_DOTPROD=0 and TRELLIS_REPACK=0 into a KernelChoice at start.
//
// TRELLIS_X86 / TRELLIS_ARM64 say which family's kernels this build has: only code under
// them names an ISA's kernels, so the tree builds for either.
//
// Thread safety: every function is safe to call from any thread; ChooseKernels takes
// effect only before the first kernel is chosen, and the choice never changes after.
#pragma once

#if defined(__x86_64__)
#define TRELLIS_X86 1
#else
#define TRELLIS_X86 0
#endif
#if defined(__aarch64__)
#define TRELLIS_ARM64 1
#else
#define TRELLIS_ARM64 0
#endif

#include <optional>

namespace trellis {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avxvnni = false;
  // aarch64
  bool neon = false;
  bool neon_dotprod = false;  // sdot/udot (ARMv8.2 DotProd)
  bool neon_i8mm = false;     // smmla (ARMv8.6 I8MM)
  bool neon_fp16 = false;     // half-precision arithmetic (FEAT_FP16)
  bool neon_bf16 = false;
};

const CpuFeatures& GetCpuFeatures();

enum class KernelIsa { kScalar, kAvx2, kAvx512, kNeon };

// What the program asks of the kernels; the defaults are the best the CPU runs.
struct KernelChoice {
  // The family to start from, widest first (avx512, avx2, neon): kAvx2 skips AVX-512,
  // kScalar uses the reference kernels only. nullopt: the widest.
  std::optional<KernelIsa> cap;
  bool avxvnni = true;       // the AVX2 kernels may use AVX-VNNI
  bool neon_dotprod = true;  // the NEON kernels may use dotprod
  bool repack = true;        // weights are repacked at load (engine/model.h)
};
// Sets the choice; false (nothing changed) once a kernel has been chosen by use.
bool ChooseKernels(const KernelChoice& choice);
const KernelChoice& ChosenKernels();
// The choice the environment variables' values spell (null: unset): TRELLIS_ISA "scalar"
// or "avx2" caps (anything else: no cap), TRELLIS_AVXVNNI, TRELLIS_NEON_DOTPROD and
// TRELLIS_REPACK "0" turn their feature off.
KernelChoice KernelChoiceFromValues(const char* isa, const char* avxvnni, const char* neon_dotprod, const char* repack);

// kAvx2 needs AVX2+FMA+F16C; kAvx512 needs AVX-512 F/BW/VL/DQ-era features plus VNNI and
// BF16; kNeon an aarch64 CPU (its dotprod kernels are chosen inside the family).
KernelIsa BestKernelIsa();

// True if this CPU can run kernels built for `isa`.
bool IsaSupported(KernelIsa isa);

const char* KernelIsaName(KernelIsa isa);

// Whether the AVX2 kernels use AVX-VNNI (the CPU has it, and the choice allows it).
bool AvxVnniEnabled();

// Whether the NEON kernels use the dotprod instructions (the CPU has them, and the choice
// allows them).
bool NeonDotprodEnabled();

// The kernel path this process runs, for reports: "avx512 (VNNI, BF16)", "avx2 (AVX-VNNI)",
// "avx2 (no VNNI)", "neon (dotprod)", "neon (no dotprod)" or "scalar".
const char* KernelPathName();

}  // namespace trellis
