#include "server/metrics.h"

#include <fmt/core.h>

namespace trellis::server {

void Histogram::Observe(double seconds) {
  ++count_;
  sum_ += seconds;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    if (seconds <= kBounds[i]) {
      ++buckets_[i];
      return;
    }
  }
}

void Histogram::Render(const std::string& name, const std::string& help, std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cum += buckets_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], cum);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

void ServerMetrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}
void ServerMetrics::ObserveTtft(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}
void ServerMetrics::ObserveInterToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.Observe(seconds);
}
void ServerMetrics::CountDisconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  ++disconnects_;
}
void ServerMetrics::CountStopString() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stop_strings_;
}

namespace {
void Metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}
}  // namespace

std::string ServerMetrics::Render(const SchedulerMetrics& m, size_t queue_depth) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  out += "# HELP trellis_http_requests_total HTTP requests answered, by endpoint and status code\n"
         "# TYPE trellis_http_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += fmt::format("trellis_http_requests_total{{endpoint=\"{}\",code=\"{}\"}} {}\n", key.first, key.second, n);
  }
  Metric(out, "trellis_requests_total", "counter", "generation requests submitted to the engine", m.requests);
  Metric(out, "trellis_requests_finished_total", "counter", "generation requests finished", m.finished);
  Metric(out, "trellis_requests_cancelled_total", "counter", "generation requests cancelled", m.cancelled);
  Metric(out, "trellis_client_disconnects_total", "counter",
         "requests whose client went away before the answer was complete (request cancelled)", disconnects_);
  Metric(out, "trellis_stop_string_matches_total", "counter", "generations ended by a stop string", stop_strings_);
  Metric(out, "trellis_prompt_tokens_total", "counter", "prompt tokens of admitted requests", m.prompt_tokens);
  Metric(out, "trellis_cached_prompt_tokens_total", "counter", "prompt tokens taken from the prefix cache",
         m.cached_tokens);
  Metric(out, "trellis_computed_tokens_total", "counter", "tokens run through the model", m.computed_tokens);
  Metric(out, "trellis_generated_tokens_total", "counter", "tokens generated", m.generated_tokens);
  Metric(out, "trellis_cache_hit_rate", "gauge", "cached prompt tokens / prompt tokens", m.HitRate());
  Metric(out, "trellis_kv_blocks_used", "gauge", "KV pool blocks in use (sessions and cache)", m.pool_used);
  Metric(out, "trellis_kv_blocks_cached", "gauge", "KV pool blocks held by the prefix cache (evictable unless shared)",
         m.tree.n_cached_blocks);
  Metric(out, "trellis_kv_blocks_total", "gauge", "KV pool blocks", m.pool_total);
  Metric(out, "trellis_kv_pool_usage_ratio", "gauge", "KV pool blocks in use / total",
         m.pool_total ? static_cast<double>(m.pool_used) / m.pool_total : 0.0);
  Metric(out, "trellis_kv_pool_tokens", "gauge", "tokens the KV pool holds (blocks x tokens per block)",
         static_cast<double>(m.pool_total) * m.block_tokens);
  Metric(out, "trellis_kv_bytes_per_token", "gauge", "bytes of K/V one token takes over all of the model's layers",
         m.kv_bytes_per_token);
  out += fmt::format("# HELP trellis_kv_cache_type The K and V cache element types\n# TYPE trellis_kv_cache_type gauge\n"
                     "trellis_kv_cache_type{{k=\"{}\",v=\"{}\"}} 1\n",
                     KvTypeName(m.kv_type_k), KvTypeName(m.kv_type_v));
  Metric(out, "trellis_queue_depth", "gauge", "requests waiting to be admitted", static_cast<double>(queue_depth));
  Metric(out, "trellis_requests_running", "gauge", "requests admitted and running", m.running);
  Metric(out, "trellis_partial_block_copies_total", "counter",
         "cached block prefixes copied into a new block (prefix reuse to the token)", m.partial_copies);
  Metric(out, "trellis_partial_block_tokens_total", "counter", "prompt tokens those copies brought",
         m.partial_tokens);
  Metric(out, "trellis_evicted_blocks_total", "counter", "cached blocks evicted from the prefix cache",
         m.evicted_blocks);
  Metric(out, "trellis_preemptions_total", "counter", "sessions preempted for KV blocks", m.preemptions);
  Metric(out, "trellis_engine_steps_total", "counter", "scheduler steps", m.steps);
  Metric(out, "trellis_grammar_masks_total", "counter", "token masks applied to constrained sampling", m.grammar_masks);
  Metric(out, "trellis_grammar_mask_seconds_total", "counter",
         "time the scheduler spent computing and applying token masks", m.grammar_mask_seconds);
  out += "# HELP trellis_store_tokens_total prompt tokens read from the prefix store, by where they were\n"
         "# TYPE trellis_store_tokens_total counter\n";
  const char* tiers[] = {"memory", "replica", "ssd", "remote"};
  for (int t = 0; t < 4; ++t) {
    out += fmt::format("trellis_store_tokens_total{{tier=\"{}\"}} {}\n", tiers[t], m.store_tier_tokens[t]);
  }
  out += "# HELP trellis_store_miss_tokens_total prompt tokens the prefix store could not give, by reason\n"
         "# TYPE trellis_store_miss_tokens_total counter\n";
  for (int k = 1; k < kStoreMissKinds; ++k) {
    out += fmt::format("trellis_store_miss_tokens_total{{reason=\"{}\"}} {}\n", StoreMissName(static_cast<StoreMiss>(k)),
                       m.store_miss_tokens[k]);
  }
  Metric(out, "trellis_store_waited_tokens_total", "counter",
         "prompt tokens read from the store after waiting for the node computing them (single-flight)",
         m.store_waited_tokens);
  Metric(out, "trellis_store_fetches_total", "counter", "prefix store lookups (and reads) completed", m.store_fetches);
  Metric(out, "trellis_store_fetch_seconds_total", "counter", "time spent in prefix store lookups and reads",
         m.store_fetch_seconds);
  Metric(out, "trellis_store_published_blocks_total", "counter", "KV blocks newly stored in the prefix store",
         m.store_published_blocks);
  Metric(out, "trellis_store_publish_failures_total", "counter", "publishes to the prefix store that failed",
         m.store_publish_failures);
  Metric(out, "trellis_store_publishes_in_flight", "gauge", "publishes to the prefix store started and not completed",
         m.store_publishes_in_flight);
  ttft_.Render("trellis_time_to_first_token_seconds", "submit to first generated token", out);
  itl_.Render("trellis_inter_token_latency_seconds", "time between generated tokens of one request", out);
  return out;
}

}  // namespace trellis::server
