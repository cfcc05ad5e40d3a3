#include "engine/kv_layout.h"

#include <fmt/core.h>

namespace trellis {

KvLayout KvLayoutFor(const ModelConfig& c, int block_size) {
  return KvLayout{c.n_layer, c.n_head_kv, c.head_dim, block_size};
}

KvLayout LocalKvLayoutFor(const Model& m, int block_size) {
  KvLayout l = KvLayoutFor(m.config(), block_size);
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

}  // namespace trellis
