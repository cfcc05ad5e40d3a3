// AVX2 + FMA + F16C tile kernels for MatMul (see matmul_internal.h for the layouts).
#include <immintrin.h>

#include "kernels/matmul_internal.h"

namespace trellis::matmul_internal {

TileKernel GetTileKernelAvx2(GgmlType) { return {}; }

}  // namespace trellis::matmul_internal
