#include "engine/moe.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

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

}  // namespace

void RouteExperts(const float* logits, int n_expert, const ExpertRouting& r, int32_t* ids, float* weights,
                  float* scratch) {
  const int k = r.k;
  // The scalar softmax, its sum in double as ggml's: the same on every ISA.
  if (r.gating == ExpertGating::kSoftmax) {
    std::copy_n(logits, n_expert, scratch);
    SoftmaxRef(scratch, n_expert);
    TopK(scratch, n_expert, k, ids);
    for (int j = 0; j < k; ++j) weights[j] = scratch[ids[j]];
  } else {
    TopK(logits, n_expert, k, ids);
    for (int j = 0; j < k; ++j) weights[j] = logits[ids[j]];
    SoftmaxRef(weights, k);
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
