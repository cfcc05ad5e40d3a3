// Helpers for engine tests: small random models written to a temp directory, a
// rewriter that copies a GGUF with changes (to make broken or variant models), and the
// NaN-proof measure logits are compared with.
#pragma once

#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "engine/random_model.h"
#include "model/gguf_writer.h"

namespace trellis::testing {

// rms(ours - ref) / std(ref) over n values, the measure logits are compared with. +inf
// when any value of either array is NaN or Inf, or ref is constant (std 0), so a
// non-finite result can never pass a `< bound` check.
double RmsOverStd(const float* ours, const float* ref, size_t n);

// max |a - b| / std(b), the per-step logits bound of the cache and store tests; +inf if
// the sizes differ, any value is NaN or Inf, or b is constant, so a broken run can never
// pass a `< bound` check.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b);

// The worse of two error figures, NaN counting as worse than anything and staying once
// there: the running worst over rows is `worst = Worse(worst, x)`. (std::max(worst, NaN)
// returns worst and hides the NaN; `if (!(x <= worst)) worst = x` lets a later finite x
// replace it.)
inline double Worse(double worst, double x) { return std::isnan(worst) || x <= worst ? worst : x; }

// A unique path under the test temp dir.
std::string TempPath(const std::string& name);

// A 2-layer, 256-wide random model (4 heads, 2 KV heads) with the 1024-token vocab of
// the reference models; type and arch as in RandomModelOptions (qwen3 gets head dim 128,
// so its Q is wider than n_embd, as in the real Qwen3 models).
std::string WriteSmallModel(const std::string& name, const std::string& type = "f32",
                            const std::string& vocab_path = "", const std::string& arch = "llama");

// The model of reference case `model` (tests/data/reference): MODEL.gguf, or, where
// MODEL.gen.json is there instead, a temp file the random-model generator writes from
// that recipe (shape, arch, type, seed, vocab: what `trellis gen-model` takes), checked
// against the XXH3 of the file llama.cpp's outputs were made from (the mixtures' f16 and
// q8_0 files, up to 8 MB, are not stored; tests/data/README.md says why the q4_k_m ones
// are). "" (and a test failure) if it cannot be made.
std::string ReferenceModelPath(const std::string& model);

struct RewriteHooks {
  // Return false to drop the key / tensor.
  std::function<bool(const std::string& key, GgufValue& value)> metadata = nullptr;
  std::function<bool(GgufTensorInfo& info)> tensor = nullptr;
  std::function<void(GgufWriter& w)> extra = nullptr;  // add keys / tensors at the end
};

// Copies src to dst through the hooks. Tensors keep their bytes unless `tensor` changes
// the type, in which case their data is zero-filled at the new size.
void RewriteGguf(const std::string& src, const std::string& dst, const RewriteHooks& hooks);

}  // namespace trellis::testing
