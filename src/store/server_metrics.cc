// The store server's stats and their Prometheus text (trellis store's /metrics).
#include <fmt/format.h>

#include "store/server_impl.h"

namespace trellis::store {

void StoreServer::Impl::UpdateGauges() {
  const TierCounters& tc = tiers->counters();
  std::lock_guard<std::mutex> lock(stats_mu);
  st.index_keys = index.size();
  st.peers = peers.size();
  st.leases_active = leases.size();
  st.claims_active = index.live_claims(net::Clock::now());
  uint64_t used = 0, on_ssd = 0, in_mem = 0, replicas = 0;
  for (const auto& [id, tn] : tiers->all()) {
    used += tn.in_mem ? tn.bytes : 0;
    in_mem += tn.in_mem && !tn.replica;
    on_ssd += tn.on_ssd;
    replicas += tn.replica;
  }
  st.tensors = in_mem;
  st.replicas = replicas;
  st.replica_bytes = tiers->replica_bytes();
  st.bytes_used = used;
  st.evictions = tc.evictions;
  st.evicted_bytes = tc.evicted_bytes;
  st.replicas_dropped = tc.replicas_dropped;
  st.ssd_flushes = tc.ssd_flushes;
  st.ssd_reads = tc.ssd_reads;
  st.ssd_evictions = tc.ssd_evictions;
  st.ssd_checksum_failures = tc.ssd_checksum_failures;
  st.ssd_tensors = on_ssd;
  st.ssd_bytes_used = ssd ? ssd->used() : 0;
  st.ssd_bytes_capacity = ssd ? ssd->capacity() : 0;
  st.ssd_log_compactions = ssd ? ssd->log_compactions() : 0;
  st.ssd_write_failures = ssd ? ssd->write_failures() : 0;
  st.ssd_read_failures = ssd ? ssd->read_failures() : 0;
  st.ssd_log_write_failures = ssd ? ssd->log_write_failures() : 0;
}

StatsReply StoreServer::Impl::StatsForWire() {
  UpdateGauges();
  std::lock_guard<std::mutex> lock(stats_mu);
  StatsReply r;
  r.memory_used = st.bytes_used;
  r.memory_capacity = st.bytes_capacity;
  r.tensors = st.tensors;
  r.replicas = st.replicas;
  r.replica_bytes = st.replica_bytes;
  r.replica_hits = st.replica_hits;
  r.ssd_used = st.ssd_bytes_used;
  r.ssd_capacity = st.ssd_bytes_capacity;
  r.ssd_tensors = st.ssd_tensors;
  r.ssd_reads = st.ssd_reads;
  r.lookups = st.lookups;
  r.lookup_blocks_matched = st.lookup_blocks_matched;
  r.acquire_hits = st.acquire_hits;
  r.acquire_misses = st.acquire_misses;
  r.puts = st.puts;
  r.evictions = st.evictions;
  r.peers = st.peers;
  return r;
}

ServerStats StoreServer::stats() const {
  impl_->t->Sync([this] { impl_->UpdateGauges(); });
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->st;
}

std::string StoreServer::MetricsText() const {
  const ServerStats s = stats();
  const net::TransportStats n = impl_->t->stats();
  std::string out;
  auto m = [&](const char* name, const char* type, const char* help, uint64_t v) {
    out += fmt::format("# HELP trellis_store_{0} {2}\n# TYPE trellis_store_{0} {1}\ntrellis_store_{0} {3}\n", name, type, help, v);
  };
  m("tensors", "gauge", "Owned tensors held in memory.", s.tensors);
  m("peers", "gauge", "Peer store servers known (--peers or etcd).", s.peers);
  m("replicas", "gauge", "Replicas of other nodes' tensors held in memory.", s.replicas);
  m("replica_bytes", "gauge", "Bytes of replicas in memory.", s.replica_bytes);
  m("replica_hits_total", "counter", "Tensor ranges served from a replica.", s.replica_hits);
  m("replicas_made_total", "counter", "Replicas copied from their owners.", s.replicas_made);
  m("replicas_dropped_total", "counter", "Replicas evicted.", s.replicas_dropped);
  m("replication_failures_total", "counter", "Replications that did not complete.", s.replication_failures);
  m("memory_bytes_used", "gauge", "Bytes of tensors in memory.", s.bytes_used);
  m("memory_bytes_capacity", "gauge", "Size of the memory tier.", s.bytes_capacity);
  m("index_keys", "gauge", "Chain keys indexed on this node.", s.index_keys);
  m("puts_total", "counter", "Tensors stored.", s.puts);
  m("put_bytes_total", "counter", "Bytes stored.", s.put_bytes);
  m("put_failures_total", "counter", "Puts whose bytes could not be read from the client.", s.put_failures);
  m("lookups_total", "counter", "Longest-prefix lookups served.", s.lookups);
  m("lookup_blocks_matched_total", "counter", "Blocks matched by lookups.", s.lookup_blocks_matched);
  m("claimed_keys_total", "counter", "Keys claimed by a computing client (single-flight).", s.claims);
  m("claim_waits_total", "counter", "Lookups told another client is computing what they need.", s.claim_waits);
  m("acquire_hits_total", "counter", "Tensor ranges leased for reading.", s.acquire_hits);
  m("acquire_misses_total", "counter", "Tensor ranges asked for and not held.", s.acquire_misses);
  m("evictions_total", "counter", "Tensors evicted from memory.", s.evictions);
  m("evicted_bytes_total", "counter", "Bytes evicted from memory.", s.evicted_bytes);
  m("full_refusals_total", "counter", "Puts refused because memory was full of leased tensors.", s.full_refusals);
  m("leases_active", "gauge", "Leases held by readers.", s.leases_active);
  m("claims_active", "gauge", "Keys claimed by a computing client and not yet stored, unclaimed or expired.", s.claims_active);
  m("lease_expiries_total", "counter", "Leases that expired unreleased.", s.lease_expiries);
  m("refused_requests_total", "counter", "Malformed requests refused.", s.refused_requests);
  m("ssd_tensors", "gauge", "Tensors in the SSD tier.", s.ssd_tensors);
  m("ssd_bytes_used", "gauge", "Bytes of tensors in the SSD tier.", s.ssd_bytes_used);
  m("ssd_bytes_capacity", "gauge", "Size of the SSD tier.", s.ssd_bytes_capacity);
  m("ssd_flushes_total", "counter", "Tensors written to SSD as they left memory.", s.ssd_flushes);
  m("ssd_reads_total", "counter", "Tensors read back from SSD.", s.ssd_reads);
  m("ssd_evictions_total", "counter", "Tensors dropped from SSD for room.", s.ssd_evictions);
  m("put_checksum_failures_total", "counter", "Puts whose bytes landed unlike the writer's checksums (refused, not indexed).", s.put_checksum_failures);
  m("checksum_failures_total", "counter", "SSD reads whose blocks failed their checksums (discarded).", s.ssd_checksum_failures);
  m("ssd_restored_total", "counter", "Tensors found intact on SSD at start.", s.ssd_restored);
  m("ssd_entries_dropped_total", "counter", "Tensors of this server the index log named at start that had not survived (their entries dropped).", s.ssd_entries_dropped);
  m("ssd_log_records_skipped_total", "counter", "Bad index log records skipped at start.", s.ssd_log_records_skipped);
  m("ssd_log_compactions_total", "counter", "Index log rewrites with the live entries alone.", s.ssd_log_compactions);
  m("ssd_write_failures_total", "counter", "Tensor writes to SSD the file system refused (ENOSPC, EIO); the tensor left memory unsaved.", s.ssd_write_failures);
  m("ssd_read_failures_total", "counter", "Tensor reads from SSD the file system refused (EIO); each a miss.", s.ssd_read_failures);
  m("ssd_log_write_failures_total", "counter", "Index log appends or compactions the file system refused.", s.ssd_log_write_failures);
  m("ssd_rejected_total", "counter", "Tensor files found bad at start (deleted).", s.ssd_rejected);
  m("get_bytes_total", "counter", "Bytes this node read from peers by bulk reads (puts, replicas).", n.get_bytes);
  m("messages_refused_total", "counter", "Messages refused by the transport.", n.messages_refused);
  if (n.faults_injected > 0 || impl_->opt.transport.fault_flip_landed_every > 0) {
    m("faults_injected_total", "counter", "Bytes flipped in landed segments by --fault-flip-landed (chaos runs).", n.faults_injected);
  }
  return out;
}

}  // namespace trellis::store
