// ModelConfig: the hyperparameters of a llama-family model, read from GGUF metadata.
//
// TinyLlama, Llama 2, Llama 3 and Mistral all use general.architecture = "llama" in
// GGUF; they differ only in values read here (GQA ratio, rope theta, vocab, rope
// scaling). Anything else is rejected with an error naming the architecture.
//
// Thread safety: plain value type.
#pragma once

#include <cstdint>
#include <string>

#include "model/gguf.h"
#include "util/status.h"

namespace trellis {

struct ModelConfig {
  std::string arch;        // "llama"
  std::string name;        // general.name, informational
  int n_vocab = 0;
  int n_ctx_train = 0;     // context length the model was trained with
  int n_embd = 0;
  int n_layer = 0;
  int n_ff = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;        // n_embd / n_head
  int n_rot = 0;           // rotated dims per head (llama.rope.dimension_count)
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / llama.rope.scaling.factor for "linear" scaling
  float rms_eps = 1e-5f;

  // Reads and validates the llama.* keys. Errors name the missing or bad key.
  static Result<ModelConfig> FromGguf(const GgufFile& gguf);

  // K/V floats per token per layer (n_head_kv * head_dim).
  int kv_dim() const { return n_head_kv * head_dim; }
};

}  // namespace trellis
