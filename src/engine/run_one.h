// RunOne: one request run to completion on a Scheduler, on the calling thread: what
// `trellis run`, `bench speed`'s generation phase and the model tests use, so they go
// through the production driver (admission, paging, chunked prefill, sampling) and not a
// second generation loop.
//
// Thread safety: the caller owns the scheduler (no EngineLoop running it).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/scheduler.h"
#include "util/status.h"

namespace trellis {

struct OneRun {
  RequestResult result;               // tokens, cache receipt, prompt_logits, timings
  // With Request::logits: row k (n_vocab floats) is the distribution generated token k
  // was drawn from (row 0: after the last prompt position; row k: after token k - 1).
  std::vector<float> step_logits;
};

// Submits `req`, steps the scheduler until it finishes, and returns what it produced. A
// request the scheduler refuses (Validate) is that error; one that ends with kError is its
// error. on_token (optional) sees each generated token as it is drawn; returning false
// cancels the request (the result then ends with kCancelled).
Result<OneRun> RunOne(Scheduler& s, Request req, const std::function<bool(int32_t)>& on_token = nullptr);

}  // namespace trellis
