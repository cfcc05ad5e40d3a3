// AVX-512 build of the PagedAttention tile kernel (compiled with -mavx512f/bw/vl/dq...;
// called only after the run-time CPU check). Shapes whose head_dim or block_size is not
// a multiple of 16 run the 8-lane instantiation. Thread safety: stateless.
#include "kernels/attention_simd_inl.h"

namespace trellis::internal {

void AttnTileAvx512(const AttnTile& t) {
  if (t.head_dim % 16 == 0 && t.block_size % 16 == 0) {
    AttnTileT<V512>(t);
  } else {
    AttnTileT<V256>(t);
  }
}

}  // namespace trellis::internal
