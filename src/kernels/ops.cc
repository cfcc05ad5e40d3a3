// Scalar references, RoPE and run-time dispatch for the kernels in ops.h.
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu_features.h"
#include "util/status.h"

namespace trellis {
namespace internal {
namespace {

KernelIsa ToIsa(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar: return KernelIsa::kScalar;
    case SimdLevel::kAvx2: return KernelIsa::kAvx2;
    case SimdLevel::kAvx512: return KernelIsa::kAvx512;
    case SimdLevel::kNeon: return KernelIsa::kNeon;
  }
  return KernelIsa::kScalar;
}

}  // namespace

SimdLevel BestSimdLevel() {
  switch (BestKernelIsa()) {
    case KernelIsa::kAvx512: return SimdLevel::kAvx512;
    case KernelIsa::kAvx2: return SimdLevel::kAvx2;
    case KernelIsa::kNeon: return SimdLevel::kNeon;
    case KernelIsa::kScalar: return SimdLevel::kScalar;
  }
  return SimdLevel::kScalar;
}

bool CpuSupports(SimdLevel level) { return IsaSupported(ToIsa(level)); }

std::vector<SimdLevel> SupportedSimdLevels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kNeon}) {
    if (CpuSupports(l)) levels.push_back(l);
  }
  return levels;
}

void RmsNormAt(SimdLevel level, const float* x, const float* weight, int64_t n, float eps,
               float* out) {
#if TRELLIS_X86
  if (level == SimdLevel::kAvx512) return RmsNormAvx512(x, weight, n, eps, out);
  if (level == SimdLevel::kAvx2) return RmsNormAvx2(x, weight, n, eps, out);
#elif TRELLIS_ARM64
  if (level == SimdLevel::kNeon) return RmsNormNeon(x, weight, n, eps, out);
#endif
  return RmsNormRef(x, weight, n, eps, out);
}

void SoftmaxAt(SimdLevel level, float* x, int64_t n) {
#if TRELLIS_X86
  if (level == SimdLevel::kAvx512) return SoftmaxAvx512(x, n);
  if (level == SimdLevel::kAvx2) return SoftmaxAvx2(x, n);
#elif TRELLIS_ARM64
  if (level == SimdLevel::kNeon) return SoftmaxNeon(x, n);
#endif
  return SoftmaxRef(x, n);
}

void SwiGluAt(SimdLevel level, const float* gate, const float* up, float* out, int64_t n) {
#if TRELLIS_X86
  if (level == SimdLevel::kAvx512) return SwiGluAvx512(gate, up, out, n);
  if (level == SimdLevel::kAvx2) return SwiGluAvx2(gate, up, out, n);
#elif TRELLIS_ARM64
  if (level == SimdLevel::kNeon) return SwiGluNeon(gate, up, out, n);
#endif
  return SwiGluRef(gate, up, out, n);
}

void GeGluAt(SimdLevel level, const float* gate, const float* up, float* out, int64_t n) {
#if TRELLIS_X86
  if (level == SimdLevel::kAvx512) return GeGluAvx512(gate, up, out, n);
  if (level == SimdLevel::kAvx2) return GeGluAvx2(gate, up, out, n);
#elif TRELLIS_ARM64
  if (level == SimdLevel::kNeon) return GeGluNeon(gate, up, out, n);
#endif
  return GeGluRef(gate, up, out, n);
}

}  // namespace internal

// ---- RMSNorm ----

void RmsNormRef(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float s = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s * weight[i];
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  internal::RmsNormAt(internal::BestSimdLevel(), x, weight, n, eps, out);
}

// ---- RoPE ----

void RopeYarnCorrDims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float dims[2]) {
  auto corr_dim = [&](float n_rot) {
    return static_cast<float>(n_dims) * std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2 * static_cast<float>(M_PI))) /
           (2 * std::log(freq_base));
  };
  dims[0] = std::max(0.0f, std::floor(corr_dim(beta_fast)));
  dims[1] = std::min(static_cast<float>(n_dims - 1), std::ceil(corr_dim(beta_slow)));
}

namespace {

// What pair i's angle is multiplied by beside base^(-2i/n) / ff: freq_scale, or YaRN's mix
// of it and 1.
double RopeScale(const RopeParams& p, int i) {
  if (p.ext_factor == 0.0f) return p.freq_scale;
  const double y = (i - p.corr_dims[0]) / std::max(0.001, static_cast<double>(p.corr_dims[1] - p.corr_dims[0]));
  const double mix = (1.0 - std::min(1.0, std::max(0.0, y))) * p.ext_factor;
  return p.freq_scale * (1.0 - mix) + mix;
}

}  // namespace

void RopeRef(float* x, int64_t stride, int64_t n_tokens, const int32_t* pos, int n_head,
             int head_dim, const RopeParams& p) {
  TRELLIS_CHECK(p.n_dims % 2 == 0 && p.n_dims <= head_dim);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_head; ++h) {
      float* v = x + t * stride + static_cast<int64_t>(h) * head_dim;
      for (int i = 0; i < p.n_dims / 2; ++i) {
        double theta = static_cast<double>(pos[t]) * RopeScale(p, i) *
                       std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_dims);
        if (p.freq_factors != nullptr) theta /= p.freq_factors[i];
        const double c = std::cos(theta) * p.attn_factor, s = std::sin(theta) * p.attn_factor;
        const int i0 = p.neox ? i : 2 * i, i1 = p.neox ? i + p.n_dims / 2 : 2 * i + 1;
        const double x0 = v[i0], x1 = v[i1];
        v[i0] = static_cast<float>(x0 * c - x1 * s);
        v[i1] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }
}

namespace {
constexpr int kMaxRopePairs = 512;
}  // namespace

void RopeTables(const int32_t* pos, int64_t n_tokens, const RopeParams& p, float* cs) {
  TRELLIS_CHECK(p.n_dims % 2 == 0 && p.n_dims / 2 <= kMaxRopePairs);
  const int n_pairs = p.n_dims / 2;
  // inv_freq[i] = freq_scale * base^(-2i/n) / ff[i], on the stack (no heap).
  float inv_freq[kMaxRopePairs];
  for (int i = 0; i < n_pairs; ++i) {
    float f = static_cast<float>(RopeScale(p, i)) * std::pow(p.freq_base, -2.0f * static_cast<float>(i) /
                                                                               static_cast<float>(p.n_dims));
    if (p.freq_factors != nullptr) f /= p.freq_factors[i];
    inv_freq[i] = f;
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float position = static_cast<float>(pos[t]);
    float* cos_t = cs + t * p.n_dims;
    float* sin_t = cos_t + n_pairs;
    for (int i = 0; i < n_pairs; ++i) {
      const float theta = position * inv_freq[i];
      cos_t[i] = std::cos(theta) * p.attn_factor;
      sin_t[i] = std::sin(theta) * p.attn_factor;
    }
  }
}

void Rope(float* x, int64_t stride, int64_t n_tokens, const int32_t* pos, int n_head,
          int head_dim, const RopeParams& p) {
  TRELLIS_CHECK(p.n_dims % 2 == 0 && p.n_dims <= head_dim && p.n_dims / 2 <= kMaxRopePairs);
  float cs[2 * kMaxRopePairs];  // one token's table
  for (int64_t t = 0; t < n_tokens; ++t) {
    RopeTables(pos + t, 1, p, cs);
    RopeApply(x + t * stride, stride, 1, cs, n_head, head_dim, p);
  }
}

void RopeApply(float* x, int64_t stride, int64_t n_tokens, const float* cs, int n_head, int head_dim,
               const RopeParams& p) {
  TRELLIS_CHECK(p.n_dims % 2 == 0 && p.n_dims <= head_dim);
  const int n_pairs = p.n_dims / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* cos_t = cs + t * p.n_dims;
    const float* sin_t = cos_t + n_pairs;
    for (int h = 0; h < n_head; ++h) {
      float* v = x + t * stride + static_cast<int64_t>(h) * head_dim;
      if (p.neox) {
        float* w = v + n_pairs;
        for (int i = 0; i < n_pairs; ++i) {
          const float x0 = v[i], x1 = w[i];
          v[i] = x0 * cos_t[i] - x1 * sin_t[i];
          w[i] = x0 * sin_t[i] + x1 * cos_t[i];
        }
      } else {
        for (int i = 0; i < n_pairs; ++i) {
          const float x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * cos_t[i] - x1 * sin_t[i];
          v[2 * i + 1] = x0 * sin_t[i] + x1 * cos_t[i];
        }
      }
    }
  }
}

// ---- Softmax ----

void SoftmaxRef(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void Softmax(float* x, int64_t n) { internal::SoftmaxAt(internal::BestSimdLevel(), x, n); }

// ---- SwiGLU ----

void SwiGluRef(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  internal::SwiGluAt(internal::BestSimdLevel(), gate, up, out, n);
}

// ---- GeGLU ----

void GeGluRef(const float* gate, const float* up, float* out, int64_t n) {
  constexpr double kC = 0.7978845608028654;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(kC * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

void GeGlu(const float* gate, const float* up, float* out, int64_t n) {
  internal::GeGluAt(internal::BestSimdLevel(), gate, up, out, n);
}

}  // namespace trellis
