// GGML tensor types as numbered in GGUF files, and their block geometry.
//
// A tensor row of n elements in a quantized type is n / BlockElems(t) blocks of
// BlockBytes(t) bytes each. The numbering is the on-disk one (ggml.h's enum ggml_type);
// types we cannot compute with are still named so errors can say what a file holds.
//
// Thread safety: constant data only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace trellis {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  std::string_view name;  // "q4_K", as ggml names it; empty if the id is unknown
  int64_t block_elems;    // elements per block (1 for plain types)
  int64_t block_bytes;    // bytes per block
  bool computable;        // Trellis has kernels for it (F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS)
};

// Traits for a raw type id from a file. Unknown ids get empty name and zero sizes.
GgmlTypeTraits GetGgmlTypeTraits(uint32_t type_id);
inline GgmlTypeTraits GetGgmlTypeTraits(GgmlType t) { return GetGgmlTypeTraits(static_cast<uint32_t>(t)); }

// Bytes of a row of n elements; n must be a multiple of the block size.
inline int64_t RowBytes(GgmlType t, int64_t n) {
  const GgmlTypeTraits tr = GetGgmlTypeTraits(t);
  return n / tr.block_elems * tr.block_bytes;
}

}  // namespace trellis
