#include "engine/kv_layout.h"

#include <fmt/core.h>

#include "kernels/attention_internal.h"

namespace trellis {

KvLayout KvLayoutFor(const ModelConfig& c, int block_size, KvType k, KvType v) {
  return KvLayout{c.n_layer, c.n_head_kv, c.head_dim, block_size, k, v};
}

KvLayout LocalKvLayoutFor(const Model& m, int block_size, KvType k, KvType v) {
  KvLayout l = KvLayoutFor(m.config(), block_size, k, v);
  l.n_layer = m.n_local_layers();
  return l;
}

Status CheckBlockSize(const ModelConfig& c, int block_size) {
  if (block_size < 1 || block_size > 4096 || (static_cast<int64_t>(block_size) * c.head_dim) % 32 != 0) {
    return InvalidArgument(
        fmt::format("block size {} is not usable (1..4096, block_size x head_dim a multiple of 32)", block_size));
  }
  return Status::Ok();
}

Status CheckKvTypes(const ModelConfig& c, KvType k, KvType v) {
  for (KvType t : {k, v}) {
    if (t != KvType::kF16 && (c.head_dim % 32 != 0 || c.head_dim > internal::kKvMaxQuantizedHeadDim)) {
      return Unsupported(fmt::format("K/V type {} needs head_dim a multiple of 32 up to {} (this model's is {}): use f16",
                                     KvTypeName(t), internal::kKvMaxQuantizedHeadDim, c.head_dim));
    }
  }
  return Status::Ok();
}

}  // namespace trellis
