// NEON build of the PagedAttention tile kernel (aarch64). Thread safety: stateless.
#include "kernels/attention_simd_inl.h"

namespace trellis::internal {

void AttnTileNeon(const AttnTile& t) { AttnTileT<V128>(t); }

}  // namespace trellis::internal
