// CPU feature detection and the choice of SIMD kernel family.
//
// GetCpuFeatures() reads cpuid and xgetbv once (the OS must enable the AVX / AVX-512
// register state, not just the CPU advertise it). BestKernelIsa() picks the widest kernel
// family the CPU runs, capped by the environment variable TRELLIS_ISA=scalar|avx2|avx512
// (read once; a request above what the CPU has is lowered to what it has).
//
// Thread safety: both functions are safe to call from any thread; results are computed
// once (function-local statics) and never change afterwards.
#pragma once

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
};

const CpuFeatures& GetCpuFeatures();

enum class KernelIsa { kScalar, kAvx2, kAvx512 };

// kAvx2 needs AVX2+FMA+F16C; kAvx512 needs AVX-512 F/BW/VL/DQ-era features plus VNNI and BF16.
KernelIsa BestKernelIsa();

// True if this CPU can run kernels built for `isa`.
bool IsaSupported(KernelIsa isa);

const char* KernelIsaName(KernelIsa isa);

// Whether the AVX2 kernels use AVX-VNNI (the CPU has it, and TRELLIS_AVXVNNI is not "0").
bool AvxVnniEnabled();

// The kernel path this process runs, for reports: "avx512 (VNNI, BF16)", "avx2 (AVX-VNNI)",
// "avx2 (no VNNI)" or "scalar".
const char* KernelPathName();

}  // namespace trellis
