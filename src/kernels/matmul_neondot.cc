// Dotprod build of the NEON tiles (matmul_neon_inl.h): sdot on 16 int8 lanes (compiled
// with -march=armv8.2-a+dotprod; called only when the CPU reports it). Thread safety:
// pure functions.
#define TRELLIS_NEON_DOTPROD 1
#include "kernels/matmul_neon_inl.h"

namespace trellis::matmul_internal {

TileKernel GetTileKernelNeonDot(GgmlType type) { return TileKernelNeonFamily(type); }

}  // namespace trellis::matmul_internal
