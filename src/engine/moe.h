// The router of a mixture-of-experts layer: from one token's router logits to the experts
// it runs through and their weights, by the rules llama.cpp applies per architecture
// (docs/moe.md; ggml's build_moe_ffn).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "model/model_config.h"

namespace trellis {

struct ExpertRouting {
  ExpertGating gating = ExpertGating::kSoftmax;
  bool renormalize = false;
  int k = 1;  // experts per token

  static ExpertRouting Of(const ModelConfig& c) { return {c.expert_gating, c.expert_renorm, c.n_expert_used}; }
};

// Chooses r.k of n_expert experts for one token: ids[0..k) in descending weight order
// (ties: the lower id first), weights[0..k) their weights.
// REQUIRES: 1 <= r.k <= n_expert; scratch holds n_expert floats.
void RouteExperts(const float* logits, int n_expert, const ExpertRouting& r, int32_t* ids, float* weights,
                  float* scratch);

}  // namespace trellis
