// Avx2 builds of the row kernels in ops.h (compiled with -mavx2 flags; called only
// after the run-time CPU check in ops.cc). Thread safety: stateless.
#include "kernels/ops.h"
#include "kernels/ops_simd_inl.h"

namespace trellis::internal {

void RmsNormAvx2(const float* x, const float* weight, int64_t n, float eps, float* out) {
  RmsNormT<V256>(x, weight, n, eps, out);
}

void SoftmaxAvx2(float* x, int64_t n) { SoftmaxT<V256>(x, n); }

void SwiGluAvx2(const float* gate, const float* up, float* out, int64_t n) {
  SwiGluT<V256>(gate, up, out, n);
}

void GeGluAvx2(const float* gate, const float* up, float* out, int64_t n) {
  GeGluT<V256>(gate, up, out, n);
}

}  // namespace trellis::internal
