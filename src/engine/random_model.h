// Random-weight llama models of named shapes, written as GGUF: test and benchmark
// models without any download. Random weights cost exactly what trained ones cost.
//
// Thread safety: plain functions; WriteRandomModel uses its own threads.
#pragma once

#include <cstdint>
#include <string>

#include "model/gguf.h"
#include "util/status.h"

namespace trellis {

struct ModelShape {
  std::string name;
  int n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx;
  float rope_theta, rms_eps;
  int head_dim = 0;  // 0: n_embd / n_head; else written as attention.key_length/value_length
  int n_rot = 0;     // rotated dims per head; 0: all of them
  // Mixtures of experts (arch qwen3moe or mixtral): n_ff is then each expert's width.
  int n_expert = 0, n_expert_used = 0;
};

// "tinyllama": TinyLlama-1.1B's dimensions (22 layers, 2048 wide, 32 heads, 4 KV heads,
// 5632 FFN). "tiny": the same family at a few MB (4 layers, 256 wide, 4 heads, 2 KV
// heads, 768 FFN). "ptstore": the distributed-store benchmark's model (4 layers, 1024
// wide, 16 heads, all of them KV heads, 2816 FFN, 16k context): no grouped-query
// attention, so its KV is large against its compute (16 KiB per token), as the PTStore
// evaluation's Mistral-7B's is against an A100 (bench/store_eval.cc says why). "ref-a":
// tests/data/reference's ref-a (2 layers, 256 wide, 4 heads, 2 KV heads, 768 FFN).
// Mixtures: "moe-tiny" (tests/data/reference's: 2 layers, 256 wide, 4 heads, 2 KV heads,
// 8 experts of width 256, 2 used), "qwen3-30b-a3b" (Qwen3-30B-A3B: 48 layers, 2048 wide,
// 32 heads, 4 KV heads, head dim 128, 128 experts of width 768, 8 used) and
// "mixtral-small" (Mixtral's routing, 8 experts, 2 used, at 16 layers, 2048 wide, 32
// heads, 8 KV heads, experts 5632 wide: a 6 B model with ~1.8 B active, for benchmarks).
Result<ModelShape> ModelShapeByName(const std::string& name);

struct RandomModelOptions {
  ModelShape shape;
  // What llama.cpp's converter writes for that family, with random weights:
  //   "llama"     the llama architecture, separate output matrix, norms of ones;
  //   "llama3.2"  llama with Llama 3.2's tied output (no output.weight) and rope_freqs
  //               (llama3 scaling: factor 32, low 1, high 4, original context 8192);
  //   "qwen2"     Q/K/V biases (random, std 0.5);
  //   "qwen3"     attn_q_norm / attn_k_norm (random weights in [0.5, 1.5]);
  //   "phi3"      fused attn_qkv and ffn_up (gate rows then up rows), LongRoPE:
  //               rope_factors_long (random in [1, 8]) and _short ([1, 1.5]),
  //               rope.scaling.attn_factor 1.19 and an original context of 256, so
  //               any context over 256 positions runs on the long factors;
  //   "gemma2"    post-attention / post-FFN norms (random in [0.5, 1.5]), tied output
  //               (embedding rows of norm ~1), attention soft-cap 4 and final soft-cap 3
  //               (low enough to bite on random weights), sliding window 48 on every
  //               other layer;
  //   "gemma3"    gemma2's layout without the attention soft-cap, plus Q/K norms, window
  //               48 with sliding_window_pattern 2 (layer 0 slides, layer 1 is global),
  //               rope.freq_base_swa 10000 against a global base of 1e6 with linear
  //               scaling 8 (Gemma 3 4B's);
  //   "qwen3moe"  Qwen3's attention (Q/K norms) and a mixture of the shape's n_expert
  //               experts, n_expert_used per token; router f32 (llama-quantize never
  //               quantizes it) with rows of std 3 / sqrt(n_embd), so router logits have
  //               std ~3: the choice is decisive and the weights far from uniform, so a
  //               wrong rule (top-k, renormalization) changes the answer, not its last digits;
  //   "mixtral"   the llama architecture with expert_count (as Mixtral's files are),
  //               the same router and experts;
  //   "qwen2moe"  qwen2's attention (Q/K/V biases) and the same mixture, plus a shared
  //               expert twice an expert's width with its f32 gate vector (logits of
  //               std ~2).
  std::string arch = "llama";
  // "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k". As llama-quantize
  // does, q4_0, q4_k_m and q5_k_m keep output.weight in q6_K unless `pure`; the K_M types
  // also use q6_K for attn_v and ffn_down in the layers llama.cpp gives more bits.
  std::string type = "q4_0";
  bool pure = false;
  // > 0: YaRN rope scaling (rope.scaling.type "yarn") by this factor over an original
  // context of yarn_orig_ctx positions, as the converter writes Qwen's long-context files.
  float yarn_factor = 0.0f;
  int yarn_orig_ctx = 0;
  uint64_t seed = 1;
  int n_threads = 2;
};

// Writes the model to `path`, copying every tokenizer.* key from `vocab` (the vocab
// size follows its token list).
Status WriteRandomModel(const RandomModelOptions& opts, const GgufFile& vocab, const std::string& path);

}  // namespace trellis
