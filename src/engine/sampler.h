// Sampler: turns a row of logits into the next token.
//
// The chain follows llama.cpp's default order: repetition penalty over the last
// `repeat_last_n` tokens, then top-k, top-p, min-p, temperature, and a draw from the
// remaining distribution with a seeded RNG. temperature <= 0 is greedy (argmax, ties to
// the lowest id), independent of every other setting.
//
// Thread safety: a Sampler holds its RNG and scratch; use one per session.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "util/status.h"

namespace trellis {

struct SamplerParams {
  float temperature = 0.8f;
  int top_k = 40;            // <= 0: disabled
  float top_p = 0.95f;       // >= 1: disabled
  float min_p = 0.05f;       // <= 0: disabled
  float repeat_penalty = 1.0f;  // 1: disabled
  int repeat_last_n = 64;
  uint64_t seed = 0xC0FFEE;
};

// InvalidArgument naming the first parameter out of range (non-finite temperature,
// top_p / min_p outside [0, 1], repeat_penalty <= 0, top_k < 0).
Status ValidateSamplerParams(const SamplerParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params, int n_vocab);

  // history: tokens seen so far (prompt and generated), for the repetition penalty.
  // logits may be modified (penalties applied in place).
  int32_t Sample(std::span<float> logits, std::span<const int32_t> history);

  // Argmax with ties broken towards the lowest id.
  static int32_t Greedy(std::span<const float> logits);

  const SamplerParams& params() const { return params_; }

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // (logit or prob, id), capacity n_vocab
};

}  // namespace trellis
