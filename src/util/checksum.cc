#include "util/checksum.h"

#include <xxhash.h>

namespace trellis {
namespace checksum_detail {

uint64_t Generic(const void* data, size_t size) { return XXH3_64bits(data, size); }

bool HaveAvx2() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
#else
  return false;
#endif
}

}  // namespace checksum_detail

uint64_t Checksum64(const void* data, size_t size) {
  // Short inputs are dominated by the call, not the vector width.
  if (size >= 1024 && checksum_detail::HaveAvx2()) return checksum_detail::Avx2(data, size);
  return checksum_detail::Generic(data, size);
}

}  // namespace trellis
