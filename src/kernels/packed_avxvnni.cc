// AVX-VNNI build of the AVX2 packed kernels (packed_avx2_inl.h): vpdpbusd on ymm
// (compiled with -mavxvnni; called only when the CPU reports AVX-VNNI). Thread safety:
// pure functions.
#define TRELLIS_PACKED_AVXVNNI 1
#include "kernels/packed_avx2_inl.h"

namespace trellis::matmul_internal {

PackedKernel GetPackedKernelAvxVnni(GgmlType type) { return PackedKernelAvx2Family(type); }

}  // namespace trellis::matmul_internal
