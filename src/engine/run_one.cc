#include "engine/run_one.h"

#include <optional>

namespace trellis {

Result<OneRun> RunOne(Scheduler& s, Request req, const std::function<bool(int32_t)>& on_token) {
  OneRun out;
  const bool keep_logits = req.logits;
  std::optional<RequestResult> done;
  RequestId id = 0;
  bool cancel = false;
  TRELLIS_ASSIGN_OR_RETURN(
      id, s.Submit(
              std::move(req),
              [&](RequestId, int32_t tok, std::span<const float> logits) {
                if (keep_logits) out.step_logits.insert(out.step_logits.end(), logits.begin(), logits.end());
                if (on_token && !on_token(tok)) cancel = true;
              },
              [&](RequestId, const RequestResult& r) { done = r; }));
  while (!done) {
    if (cancel) {
      s.Cancel(id);
      cancel = false;
    }
    if (!s.Step() && !done && !s.store_pending()) return Internal("the scheduler went idle before the request finished");
  }
  if (done->reason == FinishReason::kError) return done->error;
  out.result = std::move(*done);
  return out;
}

}  // namespace trellis
