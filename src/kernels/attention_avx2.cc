// AVX2 + FMA + F16C builds of the PagedAttention tile kernel and the f32 -> f16 row
// conversion used by KvWrite (compiled with -mavx2 -mfma -mf16c; called only after the
// run-time CPU check). Thread safety: stateless.
#include "kernels/attention_simd_inl.h"

namespace trellis::internal {

void AttnTileAvx2(const AttnTile& t) { AttnTileT<V256>(t); }

void F32ToF16Avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) {
    y[i] = static_cast<uint16_t>(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
  }
}

}  // namespace trellis::internal
