// AVX-512 (VNNI, BF16) tile kernels for MatMul (see matmul_internal.h for the layouts).
#include <immintrin.h>

#include "kernels/matmul_internal.h"

namespace trellis::matmul_internal {

TileKernel GetTileKernelAvx512(GgmlType) { return {}; }

}  // namespace trellis::matmul_internal
