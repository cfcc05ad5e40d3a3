// ServerMetrics: the HTTP layer's counters and latency histograms, rendered together with
// the engine's SchedulerMetrics as Prometheus text (GET /metrics). Names are listed in
// docs/server.md.
//
// Thread safety: all methods are thread-safe (one mutex; updates are a few additions).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "engine/scheduler.h"

namespace trellis::server {

class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  void Observe(double seconds);
  // Appends the _bucket/_sum/_count lines of `name`.
  void Render(const std::string& name, const std::string& help, std::string& out) const;

 private:
  std::array<uint64_t, kBounds.size()> buckets_{};  // non-cumulative counts per bound
  uint64_t count_ = 0;
  double sum_ = 0;
};

class ServerMetrics {
 public:
  // One finished HTTP request to `endpoint` ("/v1/chat/completions", ...) with `status`.
  void CountRequest(const std::string& endpoint, int status);
  void ObserveTtft(double seconds);
  void ObserveInterToken(double seconds);
  void CountDisconnect();
  void CountStopString();

  std::string Render(const SchedulerMetrics& m, size_t queue_depth) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // GUARDED_BY(mu_)
  Histogram ttft_;                                            // GUARDED_BY(mu_)
  Histogram itl_;                                             // GUARDED_BY(mu_)
  uint64_t disconnects_ = 0;                                  // GUARDED_BY(mu_)
  uint64_t stop_strings_ = 0;                                 // GUARDED_BY(mu_)
};

}  // namespace trellis::server
