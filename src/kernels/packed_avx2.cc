// Plain AVX2 build of the packed kernels (packed_avx2_inl.h); on CPUs with AVX-VNNI the
// build in packed_avxvnni.cc is used instead (TRELLIS_AVXVNNI=0 keeps this one).
// Thread safety: pure functions.
#include <cstdlib>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/packed_avx2_inl.h"

namespace trellis::matmul_internal {

// AVX-VNNI where the CPU has it, unless the KernelChoice turns it off (TRELLIS_AVXVNNI=0).
PackedKernel GetPackedKernelAvx2(GgmlType type) {
  return AvxVnniEnabled() ? GetPackedKernelAvxVnni(type) : PackedKernelAvx2Family(type);
}

}  // namespace trellis::matmul_internal
