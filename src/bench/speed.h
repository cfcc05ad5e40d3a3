// The speed benchmark (`trellis bench speed`): prompt processing (pp) and generation (tg)
// throughput as llama-bench measures them. pp = one forward pass over n_prompt tokens
// after `depth` tokens already in the KV cache; tg = n_gen single-token steps after them;
// with sessions > 1, also n_gen steps of that many sequences decoded in one batch.
// Straight on the forward pass over a paged pool: no scheduler, no sampling beyond greedy.
#pragma once

#include <vector>

#include "engine/forward.h"
#include "engine/model.h"
#include "util/status.h"

namespace trellis::bench {

struct SpeedParams {
  int threads = 2;
  int pp = 512, tg = 64;  // prompt tokens, generated tokens (0 skips that test)
  int depth = 0;          // tokens in the KV cache before each test (llama-bench's -d)
  int reps = 5;
  int block_size = 32;
  int sessions = 1;       // > 1: also the batched-decode test
  KvType kv_type_k = KvType::kF16, kv_type_v = KvType::kF16;  // the cache's element types
  bool profile = false;   // fill SpeedRuns' profiles (the timed repetitions' phases)
};

// Tokens/s of every repetition, in the order run.
struct SpeedRuns {
  std::vector<double> pp, tg, tg_batched;
  // With SpeedParams::profile: where each test's time went, summed over its repetitions.
  ForwardProfile pp_profile, tg_profile, tg_batched_profile;
};

// Runs the tests (one untimed tg warm-up first: it faults the mapped weights in).
// Errors: unusable parameters (block size, threads, negative sizes), a failed forward pass.
Result<SpeedRuns> MeasureSpeed(const Model& model, const SpeedParams& p);

}  // namespace trellis::bench
