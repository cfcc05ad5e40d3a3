// ModelConfig: the hyperparameters of a model, read from GGUF metadata.
//
// The architectures are decoder-only transformers that differ in a few switches kept
// here, so the forward pass is one pass with branches, not one per family:
//   llama  TinyLlama, Llama 2/3/3.2, Mistral, SmolLM: the base (general.architecture
//          "llama"); Llama 3.x adds rope_freqs and, at 1B/3B, a tied output.
//   qwen2  Qwen2/2.5: Q/K/V biases, NeoX RoPE.
//   qwen3  Qwen3: per-head RMSNorm of Q and K before RoPE, NeoX RoPE, head_dim from
//          attention.key_length (not n_embd / n_head).
//   phi3   Phi-3/3.5, Phi-4-mini: fused attn_qkv and ffn_up (gate and up in one matrix),
//          NeoX RoPE, LongRoPE (rope_factors_long/short chosen by the context size, and
//          rope.scaling.attn_factor), partial rotary (Phi-4-mini).
//   gemma2 Gemma 2: embeddings times sqrt(n_embd), post-attention and post-FFN norms,
//          GeGLU, attention logit soft-capping (50) and final logit soft-capping (30),
//          sliding-window attention (4096) on every other layer, NeoX RoPE, tied output.
//   gemma3 Gemma 3: as gemma2 without attention soft-capping (final only if the file
//          says), plus Q/K norm, 5 sliding-window layers per global one, and a RoPE
//          base (rope.freq_base_swa, 10000) and scale of their own on the window layers.
// Mixtures of experts (docs/moe.md): the feed-forward block is n_expert experts of width
// n_ff_exp, of which a router picks n_expert_used per token:
//   qwen3moe  Qwen3-30B-A3B, Qwen3-Coder-30B-A3B: Qwen3's attention, softmax gating,
//             the chosen weights renormalized;
//   llama     with llama.expert_count: Mixtral, the same rule on llama attention;
//   qwen2moe  Qwen1.5-MoE, Qwen2-57B-A14B: Qwen2's attention, softmax gating without
//             renormalization, plus a shared expert every token runs through, scaled
//             by a sigmoid gate of its own.
// Optional tensors any of them may carry (biases, a tied output) are the model's
// business (engine/model.h). Anything else is rejected with an error naming the
// architecture and listing the supported ones; gpt-oss is refused as a
// mixture-of-experts architecture not run yet.
//
// Thread safety: plain value type.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "model/gguf.h"
#include "util/status.h"

namespace trellis {

// How a mixture's router turns its logits into chosen experts and weights (docs/moe.md):
//   kSoftmax          softmax over every expert, the k most probable chosen (qwen3moe,
//                     Mixtral, qwen2moe);
//   kSoftmaxOfChosen  the k largest logits chosen, softmax over those k (gpt-oss).
enum class ExpertGating { kSoftmax, kSoftmaxOfChosen };

struct ModelConfig {
  std::string arch;        // general.architecture: llama, qwen2, qwen2moe, qwen3, qwen3moe, phi3, gemma2, gemma3
  std::string name;        // general.name, informational
  int n_vocab = 0;
  int n_ctx_train = 0;     // context length the model was trained with
  int n_embd = 0;
  int n_layer = 0;
  int n_ff = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;        // attention.key_length, else n_embd / n_head
  int n_rot = 0;           // rotated dims per head (rope.dimension_count)
  bool rope_neox = false;  // RoPE pairs dim i with i + n_rot/2 (qwen2, qwen3, phi3)
  bool qk_norm = false;    // per-head RMSNorm of Q and K (attn_q_norm / attn_k_norm)
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / llama.rope.scaling.factor for "linear" and "yarn" scaling
  // Multiplies cos/sin: rope.scaling.attn_factor (LongRoPE), times YaRN's magnitude
  // correction (1 + 0.1 ln factor, as llama.cpp nets it) for a YaRN model.
  float rope_attn_factor = 1.0f;
  int n_ctx_orig = 0;            // rope.scaling.original_context_length, else n_ctx_train:
                                 // a context longer than this selects rope_factors_long;
                                 // YaRN's original context
  // YaRN (rope.scaling.type "yarn"): 1 (rope.scaling.yarn_ext_factor) mixes each pair's
  // interpolated and original frequency by its ramp between the beta_fast and beta_slow
  // correction dims; 0: not YaRN.
  float rope_yarn_ext_factor = 0.0f;
  float rope_yarn_beta_fast = 32.0f, rope_yarn_beta_slow = 1.0f;
  float rms_eps = 1e-5f;
  // Gemma 2/3 (all off elsewhere).
  float embd_scale = 0.0f;     // token embeddings times this (sqrt(n_embd)); 0: none
  bool post_norms = false;     // attn_post_norm / ffn_post_norm on each sublayer's output
  bool ffn_gelu = false;       // GeGLU (tanh GELU) instead of SwiGLU
  float attn_softcap = 0.0f;   // attention scores -> c tanh(score / c); 0: none
  float final_softcap = 0.0f;  // logits -> c tanh(logit / c); 0: none
  float attn_scale = 0.0f;     // score scale; 0: 1 / sqrt(head_dim)
  int n_swa = 0;               // sliding window of the window layers, positions; 0: none
  int swa_period = 0;          // with n_swa: layer il is a window layer iff
                               // il % swa_period < swa_period - 1 (0: every layer)
  float rope_freq_base_swa = 10000.0f;  // the window layers' RoPE base (scale 1)
  // Mixture of experts (n_expert = 0: a dense FFN of width n_ff).
  int n_expert = 0;         // expert_count
  int n_expert_used = 0;    // expert_used_count: experts per token, 1..n_expert
  int n_ff_exp = 0;         // one expert's FFN width
  ExpertGating expert_gating = ExpertGating::kSoftmax;
  bool expert_renorm = false;  // the chosen weights divided by their sum (qwen3moe, Mixtral)
  int n_ff_shexp = 0;          // the shared expert's width (qwen2moe); 0: none

  // Reads and validates the ARCH.* keys. Errors name the missing or bad key.
  static Result<ModelConfig> FromGguf(const GgufFile& gguf);

  // K/V floats per token per layer (n_head_kv * head_dim).
  int kv_dim() const { return n_head_kv * head_dim; }
  // True for a sliding-window layer (attends to the last n_swa positions only).
  bool IsSwaLayer(int il) const {
    return n_swa > 0 && (swa_period == 0 || il % swa_period < swa_period - 1);
  }
  bool moe() const { return n_expert > 0; }
  // The per-session context when none is asked for: the trained one, at most 4096.
  int DefaultContext() const { return n_ctx_train < 4096 ? n_ctx_train : 4096; }
  // The longest context the model is made for: the trained one, or YaRN's original
  // context times its factor when that is longer (Qwen's files name 32k trained and
  // scale 4x past it). Longer contexts run, as in llama.cpp, with a warning.
  int MaxContext() const {
    if (rope_yarn_ext_factor == 0.0f || rope_freq_scale <= 0.0f) return n_ctx_train;
    const double scaled = static_cast<double>(n_ctx_orig) / rope_freq_scale;
    return scaled > n_ctx_train ? static_cast<int>(std::min(scaled, 1073741824.0)) : n_ctx_train;
  }
};

}  // namespace trellis
