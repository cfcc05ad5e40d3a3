// Sampler: turns a row of logits into the next token.
//
// The chain follows llama.cpp's default order: penalties, then top-k, top-p, min-p,
// temperature, and a draw from the remaining distribution with a seeded RNG.
//
// logit_bias comes first (as in llama.cpp's chain): logit[id] += bias, and a bias of -100
// bans the token outright (the logit becomes -inf), which is what OpenAI's API promises
// for -100 and what a caller banning tokens means.
//
// Penalties (llama.cpp's llama_sampler_penalties applies all three together, first):
//   repeat_penalty     CTRL-style, over the last `repeat_last_n` tokens of the history
//                      (prompt and generated), once per distinct token.
//   frequency_penalty  OpenAI's definitions, over the tokens generated so far (not the
//   presence_penalty   prompt, and not a window: llama.cpp uses its penalty window for
//                      these too, OpenAI counts the whole completion):
//                        logit[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty
//                      with c[j] the number of times j was generated.
// temperature <= 0 is greedy (argmax, ties to the lowest id) over the penalized logits:
// penalties change greedy output (as with OpenAI and llama.cpp); the truncation settings
// (top-k, top-p, min-p) do not matter to it.
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
  float presence_penalty = 0.0f;   // [-2, 2]; 0: disabled
  float frequency_penalty = 0.0f;  // [-2, 2]; 0: disabled
  uint64_t seed = 0xC0FFEE;
  // (token id, bias in [-100, 100]); ids at or past n_vocab are ignored. Callers must
  // leave at least one token unbanned (the API refuses a request banning all).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// InvalidArgument naming the first parameter out of range (non-finite temperature,
// top_p / min_p outside [0, 1], repeat_penalty <= 0, top_k < 0, presence_penalty /
// frequency_penalty outside [-2, 2], a logit_bias id < 0 or bias outside [-100, 100]).
Status ValidateSamplerParams(const SamplerParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params, int n_vocab);

  // history: tokens seen so far, the prompt's first n_prompt tokens then the generated
  // ones (the repetition penalty looks at both, presence and frequency only at the
  // generated ones). logits may be modified (penalties applied in place).
  int32_t Sample(std::span<float> logits, std::span<const int32_t> history, size_t n_prompt);

  // Argmax with ties broken towards the lowest id.
  static int32_t Greedy(std::span<const float> logits);

  const SamplerParams& params() const { return params_; }

 private:
  void ApplyLogitBias(std::span<float> logits) const;
  void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history, size_t n_prompt);

  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;  // (logit or prob, id), capacity n_vocab
  std::vector<int32_t> counts_;  // (n_vocab) zeros between calls; only with presence/frequency
};

}  // namespace trellis
