// Avx512 builds of the row kernels in ops.h (compiled with -mavx512 flags; called only
// after the run-time CPU check in ops.cc). Thread safety: stateless.
#include "kernels/ops.h"
#include "kernels/ops_simd_inl.h"

namespace trellis::internal {

void RmsNormAvx512(const float* x, const float* weight, int64_t n, float eps, float* out) {
  RmsNormT<V512>(x, weight, n, eps, out);
}

void SoftmaxAvx512(float* x, int64_t n) { SoftmaxT<V512>(x, n); }

void SwiGluAvx512(const float* gate, const float* up, float* out, int64_t n) {
  SwiGluT<V512>(gate, up, out, n);
}

void GeGluAvx512(const float* gate, const float* up, float* out, int64_t n) {
  GeGluT<V512>(gate, up, out, n);
}

}  // namespace trellis::internal
