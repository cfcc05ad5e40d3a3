// CPU feature detection and the choice of SIMD kernel family.
//
// x86-64: GetCpuFeatures() reads cpuid and xgetbv once (the OS must enable the AVX /
// AVX-512 register state, not just the CPU advertise it). aarch64: the kernel's hwcaps
// (getauxval), NEON always (Advanced SIMD is part of ARMv8-A), dotprod, i8mm, fp16 and
// bf16 where the CPU has them. BestKernelIsa() picks the widest kernel family the CPU
// runs, capped by the environment variable TRELLIS_ISA=scalar|avx2|avx512|neon (read once;
// a request above what the CPU has is lowered to what it has).
//
// TRELLIS_X86 / TRELLIS_ARM64 say which family's kernels this build has: only code under
// them names an ISA's kernels, so the tree builds for either.
//
// Thread safety: both functions are safe to call from any thread; results are computed
// once (function-local statics) and never change afterwards.
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

// kAvx2 needs AVX2+FMA+F16C; kAvx512 needs AVX-512 F/BW/VL/DQ-era features plus VNNI and
// BF16; kNeon an aarch64 CPU (its dotprod kernels are chosen inside the family).
KernelIsa BestKernelIsa();

// True if this CPU can run kernels built for `isa`.
bool IsaSupported(KernelIsa isa);

const char* KernelIsaName(KernelIsa isa);

// Whether the AVX2 kernels use AVX-VNNI (the CPU has it, and TRELLIS_AVXVNNI is not "0").
bool AvxVnniEnabled();

// Whether the NEON kernels use the dotprod instructions (the CPU has them, and
// TRELLIS_NEON_DOTPROD is not "0").
bool NeonDotprodEnabled();

// The kernel path this process runs, for reports: "avx512 (VNNI, BF16)", "avx2 (AVX-VNNI)",
// "avx2 (no VNNI)", "neon (dotprod)", "neon (no dotprod)" or "scalar".
const char* KernelPathName();

}  // namespace trellis
