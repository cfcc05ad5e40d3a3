// Monotonic time for latency measurement: free functions over steady_clock, for
// benchmarks and logs. Code whose times a test must control reads them from its Env
// instead (Env::NowNanos, util/env.h: the scheduler's request times, say), which a test's
// FaultEnv moves by hand.
#pragma once

#include <chrono>
#include <cstdint>

namespace trellis {

inline int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double NowSeconds() { return static_cast<double>(NowNanos()) * 1e-9; }

}  // namespace trellis
