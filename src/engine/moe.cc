#include "engine/moe.h"

#include <algorithm>
#include <cmath>

namespace trellis {
namespace {

// The k largest of v[0..n) by value (ties: the lower index first), in descending order.
void TopK(const float* v, int n, int k, int32_t* ids) {
  int found = 0;
  for (int i = 0; i < n; ++i) {
    // Insertion into the sorted prefix; k <= n_expert is small (8 of 128).
    if (found == k && !(v[i] > v[ids[k - 1]])) continue;
    int j = found < k ? found++ : k - 1;
    while (j > 0 && v[i] > v[ids[j - 1]]) {
      ids[j] = ids[j - 1];
      --j;
    }
    ids[j] = i;
  }
}

// out[i] = exp(v[i] - max) / sum, the sum in double as ggml's soft_max.
void Softmax(const float* v, int n, float* out) {
  float mx = v[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, v[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    out[i] = std::exp(v[i] - mx);
    sum += out[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = 0; i < n; ++i) out[i] *= inv;
}

}  // namespace

void RouteExperts(const float* logits, int n_expert, const ExpertRouting& r, int32_t* ids, float* weights,
                  float* scratch) {
  const int k = r.k;
  if (r.gating == ExpertGating::kSoftmax) {
    Softmax(logits, n_expert, scratch);
    TopK(scratch, n_expert, k, ids);
    for (int j = 0; j < k; ++j) weights[j] = scratch[ids[j]];
  } else {
    TopK(logits, n_expert, k, ids);
    for (int j = 0; j < k; ++j) scratch[j] = logits[ids[j]];
    Softmax(scratch, k, weights);
  }
  if (r.renormalize) {
    // llama.cpp clamps the sum from below instead of adding an epsilon.
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += weights[j];
    sum = std::max(sum, 6.103515625e-5f);
    for (int j = 0; j < k; ++j) weights[j] /= sum;
  }
}

}  // namespace trellis
