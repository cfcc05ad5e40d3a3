// Element-wise and row-wise kernels of the Llama forward pass other than matmul and
// attention: RMSNorm, rotary position embedding (RoPE), softmax and the SwiGLU gate.
//
// Each fast kernel picks the best SIMD path for this CPU at run time (AVX-512, AVX2 or
// scalar) and has a plain scalar *Ref the fast path is tested against.
//
// Thread safety: all functions are pure functions of their arguments (no shared state
// apart from the once-initialised CPU feature probe); concurrent calls on disjoint
// outputs are safe. None of them allocates.
#pragma once

#include <cstdint>
#include <vector>

namespace trellis {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], i < n. out may alias x.
// x, weight, out: [n]. REQUIRES: n >= 1.
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);
void RmsNormRef(const float* x, const float* weight, int64_t n, float eps, float* out);

// RoPE parameters from model metadata (llama.cpp "normal" mode as used by
// LLM_ARCH_LLAMA: rotate ADJACENT pairs (x[2i], x[2i+1])).
struct RopeParams {
  int n_dims;                    // rotated dims per head (= head_dim for llama)
  float freq_base;               // rope theta, e.g. 10000 or 500000
  float freq_scale = 1.0f;       // 1 / linear scaling factor
  const float* freq_factors = nullptr;  // optional [n_dims/2] (Llama 3.1 rope_freqs
                                        // tensor): theta_i is divided by freq_factors[i]
  // Which dims pair up: false (llama, GGML's "norm" mode) rotates (x[2i], x[2i+1]);
  // true (GPT-NeoX mode: Qwen2/3, Gemma, Phi-3) rotates (x[i], x[i + n_dims/2]).
  bool neox = false;
  // Multiplies cos and sin (so both rotated halves): LongRoPE's magnitude correction
  // (Phi-3's rope.scaling.attn_factor, ggml's attn_factor / mscale), YaRN's. 1 elsewhere.
  float attn_factor = 1.0f;
  // YaRN (ggml's rope_yarn): pair i's angle mixes the interpolated (freq_scale) and the
  // original frequency by ramp_i * ext_factor, ramp_i = 1 - clamp((i - corr_dims[0]) /
  // max(0.001, corr_dims[1] - corr_dims[0]), 0, 1): the fast dims keep their frequency,
  // the slow ones are interpolated. ext_factor 0: plain scaling by freq_scale.
  float ext_factor = 0.0f;
  float corr_dims[2] = {0.0f, 0.0f};
};

// YaRN's correction dims (ggml_rope_yarn_corr_dims): the pairs whose wavelength passes
// beta_fast and beta_slow rotations over the original context.
void RopeYarnCorrDims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float dims[2]);

// Rotates x in place: x is [n_tokens] rows (row stride `stride` floats), each
// [n_head][head_dim]; token t is at position pos[t] (pos: [n_tokens]).
// theta_i = pos * freq_scale * freq_base^(-2i/n_dims) / ff[i] (YaRN: freq_scale mixed
// with 1 as RopeParams says); pair i is (x[2i], x[2i+1]),
// or (x[i], x[i + n_dims/2]) with p.neox;
// (x0,x1) -> (x0 cos - x1 sin, x0 sin + x1 cos), cos and sin times p.attn_factor.
// Dims >= n_dims are left unchanged (partial rotary, e.g. Phi-4-mini).
// REQUIRES: n_dims even, n_dims <= head_dim.
void Rope(float* x, int64_t stride, int64_t n_tokens, const int32_t* pos, int n_head,
          int head_dim, const RopeParams& p);
void RopeRef(float* x, int64_t stride, int64_t n_tokens, const int32_t* pos, int n_head,
             int head_dim, const RopeParams& p);
// Rope in two steps, for callers that rotate several tensors (Q and K, every layer) at the
// same positions: RopeTables computes each token's cos and sin once (cs: n_tokens rows of
// n_dims floats, the n_dims / 2 cosines then the sines, times attn_factor), RopeApply
// rotates with them. Together exactly Rope (Rope is built on them).
void RopeTables(const int32_t* pos, int64_t n_tokens, const RopeParams& p, float* cs);
void RopeApply(float* x, int64_t stride, int64_t n_tokens, const float* cs, int n_head, int head_dim,
               const RopeParams& p);

// In place, numerically stable (max-subtracted). x: [n], REQUIRES: n >= 1.
void Softmax(float* x, int64_t n);
void SoftmaxRef(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i]; silu(g) = g / (1 + exp(-g)). out may alias gate.
// gate, up, out: [n].
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);
void SwiGluRef(const float* gate, const float* up, float* out, int64_t n);

// out[i] = gelu(gate[i]) * up[i] with the tanh GELU (Gemma's GeGLU, ggml_gelu):
// gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) = g / (1 + exp(-2u)),
// u = sqrt(2/pi) (g + 0.044715 g^3). out may alias gate.
void GeGlu(const float* gate, const float* up, float* out, int64_t n);
void GeGluRef(const float* gate, const float* up, float* out, int64_t n);

namespace internal {

// SIMD level a kernel runs at. Tests force each level the CPU supports.
enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kNeon = 3 };

// Best level for this CPU, within the program's KernelChoice (cpu_features.h).
SimdLevel BestSimdLevel();
// True if this CPU can run kernels of `level`.
bool CpuSupports(SimdLevel level);
// Every level this CPU can run, scalar first (what the tests loop over).
std::vector<SimdLevel> SupportedSimdLevels();

// Per-level entry points (what the public functions dispatch to).
void RmsNormAt(SimdLevel level, const float* x, const float* weight, int64_t n, float eps,
               float* out);
void SoftmaxAt(SimdLevel level, float* x, int64_t n);
void SwiGluAt(SimdLevel level, const float* gate, const float* up, float* out, int64_t n);
void GeGluAt(SimdLevel level, const float* gate, const float* up, float* out, int64_t n);

// ISA-specific kernels (ops_avx2.cc, ops_avx512.cc on x86-64, ops_neon.cc on aarch64).
// Call only if CpuSupports().
void RmsNormAvx2(const float* x, const float* weight, int64_t n, float eps, float* out);
void SoftmaxAvx2(float* x, int64_t n);
void SwiGluAvx2(const float* gate, const float* up, float* out, int64_t n);
void GeGluAvx2(const float* gate, const float* up, float* out, int64_t n);
void RmsNormAvx512(const float* x, const float* weight, int64_t n, float eps, float* out);
void SoftmaxAvx512(float* x, int64_t n);
void SwiGluAvx512(const float* gate, const float* up, float* out, int64_t n);
void GeGluAvx512(const float* gate, const float* up, float* out, int64_t n);
void RmsNormNeon(const float* x, const float* weight, int64_t n, float eps, float* out);
void SoftmaxNeon(float* x, int64_t n);
void SwiGluNeon(const float* gate, const float* up, float* out, int64_t n);
void GeGluNeon(const float* gate, const float* up, float* out, int64_t n);

}  // namespace internal
}  // namespace trellis
