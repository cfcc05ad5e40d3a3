// Compiled with -mavx2 (see CMakeLists.txt): xxhash.h's XXH3 inlined here picks its AVX2
// accumulate loop at compile time. Called only after checksum.cc saw AVX2 on the CPU.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/checksum.h"

namespace trellis::checksum_detail {

uint64_t Avx2(const void* data, size_t size) { return XXH3_64bits(data, size); }

}  // namespace trellis::checksum_detail
