// NEON builds of the row kernels in ops.h (aarch64, where Advanced SIMD is part of the
// base ISA). Thread safety: stateless.
#include "kernels/ops.h"
#include "kernels/ops_simd_inl.h"

namespace trellis::internal {

void RmsNormNeon(const float* x, const float* weight, int64_t n, float eps, float* out) {
  RmsNormT<V128>(x, weight, n, eps, out);
}

void SoftmaxNeon(float* x, int64_t n) { SoftmaxT<V128>(x, n); }

void SwiGluNeon(const float* gate, const float* up, float* out, int64_t n) {
  SwiGluT<V128>(gate, up, out, n);
}

void GeGluNeon(const float* gate, const float* up, float* out, int64_t n) {
  GeGluT<V128>(gate, up, out, n);
}

}  // namespace trellis::internal
