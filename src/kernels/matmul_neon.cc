// ARMv8-A build of the NEON tiles (matmul_neon_inl.h); on CPUs with the dotprod extension
// the build in matmul_neondot.cc runs instead (TRELLIS_NEON_DOTPROD=0 keeps this one).
// Thread safety: pure functions.
#include "kernels/cpu_features.h"
#include "kernels/matmul_neon_inl.h"

namespace trellis::matmul_internal {

TileKernel GetTileKernelNeonDot(GgmlType type);  // matmul_neondot.cc

TileKernel GetTileKernelNeon(GgmlType type, int64_t n_tokens) {
  (void)n_tokens;
  return NeonDotprodEnabled() ? GetTileKernelNeonDot(type) : TileKernelNeonFamily(type);
}

}  // namespace trellis::matmul_internal
