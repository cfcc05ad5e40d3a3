#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace trellis {

Sampler::Sampler(const SamplerParams& params, int n_vocab) : params_(params), rng_(params.seed) {
  cand_.reserve(static_cast<size_t>(n_vocab));
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    counts_.assign(static_cast<size_t>(n_vocab), 0);
  }
}

int32_t Sampler::Greedy(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  return best;
}

Status ValidateSamplerParams(const SamplerParams& p) {
  if (!std::isfinite(p.temperature)) return InvalidArgument("temperature must be a finite number (0 = greedy)");
  if (!(p.top_p >= 0.0f && p.top_p <= 1.0f)) return InvalidArgument("top_p must be in [0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return InvalidArgument("min_p must be in [0, 1]");
  if (!(p.repeat_penalty > 0.0f) || !std::isfinite(p.repeat_penalty)) return InvalidArgument("repeat_penalty must be > 0 (1 = off)");
  if (p.top_k < 0) return InvalidArgument("top_k must be >= 0 (0 = off)");
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return InvalidArgument("presence_penalty must be in [-2, 2] (0 = off)");
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2] (0 = off)");
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0) return InvalidArgument("logit_bias token ids must be >= 0");
    if (!(bias >= -100.0f && bias <= 100.0f)) return InvalidArgument("logit_bias biases must be in [-100, 100]");
  }
  return Status::Ok();
}

void Sampler::ApplyLogitBias(std::span<float> logits) const {
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
    float& l = logits[static_cast<size_t>(id)];
    l = bias <= -100.0f ? -std::numeric_limits<float>::infinity() : l + bias;
  }
}

void Sampler::ApplyPenalties(std::span<float> logits, std::span<const int32_t> history, size_t n_prompt) {
  const size_t n_vocab = logits.size();
  // Repetition penalty (CTRL-style, as llama.cpp): divide positive logits, multiply
  // negative ones, once per distinct token in the window.
  if (params_.repeat_penalty != 1.0f && params_.repeat_last_n != 0) {
    const size_t n = params_.repeat_last_n < 0 ? history.size()
                                               : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
    for (size_t i = history.size() - n; i < history.size(); ++i) {
      const int32_t t = history[i];
      if (t < 0 || static_cast<size_t>(t) >= n_vocab) continue;
      // Skip duplicates: only penalize on the last occurrence in the window.
      if (std::find(history.begin() + static_cast<std::ptrdiff_t>(i) + 1, history.end(), t) != history.end()) continue;
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
  }
  // Presence and frequency penalties over the generated tokens (OpenAI's definition; see
  // the header). counts_ is all zeros on entry and left so: one pass counts, a second
  // applies once per distinct token and clears, so a step costs O(generated), not O(n_vocab).
  if (counts_.empty()) return;
  const std::span<const int32_t> generated = history.subspan(std::min(n_prompt, history.size()));
  const size_t n_counts = std::min(n_vocab, counts_.size());
  for (int32_t t : generated) {
    if (t >= 0 && static_cast<size_t>(t) < n_counts) ++counts_[static_cast<size_t>(t)];
  }
  for (int32_t t : generated) {
    if (t < 0 || static_cast<size_t>(t) >= n_counts) continue;
    int32_t& c = counts_[static_cast<size_t>(t)];
    if (c == 0) continue;  // already applied
    logits[static_cast<size_t>(t)] -= static_cast<float>(c) * params_.frequency_penalty + params_.presence_penalty;
    c = 0;
  }
}

int32_t Sampler::Sample(std::span<float> logits, std::span<const int32_t> history, size_t n_prompt) {
  ApplyLogitBias(logits);
  ApplyPenalties(logits, history, n_prompt);
  // Invalid parameters are refused by ValidateSamplerParams at the API edge; a NaN that
  // slipped through still samples greedily rather than from an undefined distribution.
  if (!(params_.temperature > 0.0f) || !std::isfinite(params_.temperature)) return Greedy(logits);
  const int n_vocab = static_cast<int>(logits.size());

  cand_.clear();
  for (int i = 0; i < n_vocab; ++i) cand_.emplace_back(logits[static_cast<size_t>(i)], i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };

  size_t keep = cand_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep), cand_.end(), by_logit);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  cand_.resize(keep);
  // Banned tokens (logit_bias -100: -inf) sort last; none may be drawn, even by rounding.
  while (cand_.size() > 1 && cand_.back().first == -std::numeric_limits<float>::infinity()) cand_.pop_back();

  // Softmax over the survivors (before temperature, as llama.cpp's top-p / min-p see it).
  auto softmax = [&](float temp) {
    const float mx = cand_[0].first;
    double sum = 0;
    for (auto& c : cand_) sum += std::exp((c.first - mx) / temp);
    return std::pair<float, double>(mx, sum);
  };
  {
    auto [mx, sum] = softmax(1.0f);
    if (params_.top_p < 1.0f) {
      double cum = 0;
      size_t n = 0;
      for (; n < cand_.size(); ++n) {
        cum += std::exp(cand_[n].first - mx) / sum;
        if (cum >= params_.top_p) {
          ++n;
          break;
        }
      }
      cand_.resize(std::max<size_t>(1, std::min(n, cand_.size())));
    }
    if (params_.min_p > 0.0f) {
      // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p)
      const float cut = mx + std::log(params_.min_p);
      size_t n = 1;
      while (n < cand_.size() && cand_[n].first >= cut) ++n;
      cand_.resize(n);
    }
  }

  const float temp = params_.temperature;
  auto [mx, sum] = softmax(temp);
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng_);
  for (const auto& c : cand_) {
    r -= std::exp((c.first - mx) / temp);
    if (r <= 0) return c.second;
  }
  return cand_.back().second;
}

}  // namespace trellis
