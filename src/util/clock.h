// Monotonic time for latency measurement. Free functions over steady_clock; benches
// and the engine take timestamps through these so a fake clock can replace them later.
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
