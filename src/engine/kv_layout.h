// The KV geometry of a model: how many bytes a block of block_size positions takes (all
// layers, layer-major), in the whole model or in the layers one process holds.
#pragma once

#include "engine/model.h"
#include "kv/block_pool.h"
#include "util/status.h"

namespace trellis {

// KV geometry of a model for a given block size and K / V element types.
KvLayout KvLayoutFor(const ModelConfig& c, int block_size, KvType k = KvType::kF16, KvType v = KvType::kF16);
// The layout of the pool a process holding model part m keeps: its layers only (none at
// a grid head that runs no layers: the pool then only hands out block ids).
KvLayout LocalKvLayoutFor(const Model& m, int block_size, KvType k = KvType::kF16, KvType v = KvType::kF16);
// Whether the model's K / V rows can be held in these types: the quantized ones need
// head_dim a multiple of their 32-element blocks (as llama.cpp's cache does).
Status CheckKvTypes(const ModelConfig& c, KvType k, KvType v);
// Whether the attention kernels can use blocks of block_size positions: 1..4096, and
// block_size x head_dim a multiple of 32 (a block's K rows of one head fill whole vectors).
Status CheckBlockSize(const ModelConfig& c, int block_size);

}  // namespace trellis
