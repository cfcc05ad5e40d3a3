// Helpers for scheduler-level tests: greedy requests, and running a batch of them to
// completion while collecting every token, its logits and the result.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <span>
#include <vector>

#include "engine/scheduler.h"

namespace trellis::testing {

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // per generated token (with Request::logits)
  RequestResult result;
};

inline Request Greedy(std::vector<int32_t> prompt, int max_tokens, bool logits = true) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.logits = logits;
  return r;
}

// Submits all requests at once and runs the scheduler until it is idle.
inline std::vector<Outcome> RunAll(Scheduler& s, const std::vector<Request>& reqs) {
  std::vector<Outcome> out(reqs.size());
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = s.Submit(
        reqs[i],
        [&](RequestId id, int32_t tok, std::span<const float> l) {
          Outcome& o = out[index.at(id)];
          o.tokens.push_back(tok);
          if (!l.empty()) o.logits.emplace_back(l.begin(), l.end());
        },
        [&](RequestId id, const RequestResult& r) { out[index.at(id)].result = r; });
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    index[*id] = i;
  }
  s.RunUntilIdle();
  return out;
}

}  // namespace trellis::testing
