#include "cli/store_flags.h"

#include <sstream>

#include <nlohmann/json.hpp>

namespace trellis::cli {

void AddStoreFlags(CLI::App& app, StoreFlags* f) {
  app.add_option("--store", f->store,
                 "this node's prefix store server (HOST:PORT, `trellis store`): read prefixes other nodes computed, "
                 "publish the ones computed here");
  app.add_option("--store-peers", f->peers, "the other store servers, comma-separated (default: what --store knows)");
  app.add_option("--store-etcd", f->etcd, "etcd URL the store servers register in (membership)");
  app.add_option("--store-timeout-ms", f->timeout_ms, "longest a prefix fetch may take before computing instead")
      ->capture_default_str();
  app.add_option("--store-tls", f->tls, "UCX transports for the store (UCX_TLS)")->capture_default_str();
  app.add_option("--store-net-devices", f->net_devices, "UCX_NET_DEVICES for the store (e.g. lo on one host)");
  app.add_option("--store-spin-us", f->spin_us,
                 "microseconds the store transport keeps polling after work before it sleeps (lower read latency "
                 "for CPU the engine would compute with)")
      ->capture_default_str();
  app.add_flag("--store-no-single-flight", f->no_single_flight,
               "compute a prefix another node is computing instead of waiting for it (for comparisons)");
  // Chaos runs only (tests/chaos): not in --help.
  app.add_option("--store-fault-flip-landed", f->fault_flip_landed_every,
                 "flip a byte in every Nth block read from the store, after the transport (fault injection)")
      ->group("");
}

store::ClientOptions StoreClientOptions(const StoreFlags& f) {
  store::ClientOptions c;
  c.servers.push_back(f.store);
  c.local = f.store;
  std::stringstream ss(f.peers);
  for (std::string p; std::getline(ss, p, ',');) {
    if (!p.empty() && p != f.store) c.servers.push_back(p);
  }
  c.etcd = f.etcd;
  // Engines and grid nodes start and serve with the store (or etcd) down, and join it
  // when it comes up: a cache is never a reason not to serve.
  c.require_reachable = false;
  c.transport.tls = f.tls;
  c.transport.net_devices = f.net_devices;
  c.transport.spin_us = f.spin_us;
  c.transport.fault_flip_landed_every = f.fault_flip_landed_every;
  return c;
}

Result<std::optional<StoreBridgeOptions>> BridgeOptions(const StoreFlags& f) {
  if (f.store.empty()) {
    if (!f.peers.empty() || !f.etcd.empty()) return InvalidArgument("--store-peers and --store-etcd need --store");
    return std::optional<StoreBridgeOptions>();
  }
  if (f.timeout_ms < 1 || f.timeout_ms > 600000) return InvalidArgument("--store-timeout-ms must be in 1..600000");
  StoreBridgeOptions o;
  o.client = StoreClientOptions(f);
  o.fetch_timeout = std::chrono::milliseconds(f.timeout_ms);
  o.single_flight = !f.no_single_flight;
  return std::optional<StoreBridgeOptions>(std::move(o));
}

Result<std::unique_ptr<StoreBridge>> ConnectStore(const StoreFlags& f) {
  TRELLIS_ASSIGN_OR_RETURN(std::optional<StoreBridgeOptions> o, BridgeOptions(f));
  if (!o) return std::unique_ptr<StoreBridge>();
  auto b = StoreBridge::Connect(*o);
  if (!b.ok()) return Unavailable("--store " + f.store + ": " + b.status().ToString());
  return b;
}

std::string StoreViewJson(StoreBridge& bridge) {
  using nlohmann::json;
  json servers = json::array();
  for (const store::MemberStats& m : bridge.client().StatsOfMembers(net::After(std::chrono::seconds(1)))) {
    json s = {{"address", m.address}, {"up", m.status.ok()}};
    if (!m.status.ok()) {
      s["error"] = m.status.message();
    } else {
      const store::StatsReply& r = m.stats;
      s["memory"] = {{"used", r.memory_used}, {"capacity", r.memory_capacity}, {"tensors", r.tensors}};
      s["replicas"] = {{"count", r.replicas}, {"bytes", r.replica_bytes}, {"hits", r.replica_hits}};
      s["ssd"] = {{"used", r.ssd_used}, {"capacity", r.ssd_capacity}, {"tensors", r.ssd_tensors}, {"reads", r.ssd_reads}};
      s["lookups"] = r.lookups;
      s["lookup_blocks_matched"] = r.lookup_blocks_matched;
      s["acquire_hits"] = r.acquire_hits;
      s["acquire_misses"] = r.acquire_misses;
      s["puts"] = r.puts;
      s["evictions"] = r.evictions;
      s["peers"] = r.peers;
    }
    servers.push_back(std::move(s));
  }
  const StoreBridgeStats b = bridge.stats();
  json misses = json::object();
  for (int k = 0; k < kStoreMissKinds; ++k) misses[StoreMissName(static_cast<StoreMiss>(k))] = b.misses[k];
  const json engine = {{"fetches", b.fetches},
                       {"fetched_blocks", b.fetched_blocks},
                       {"waits", b.waits},
                       {"publishes", b.publishes},
                       {"published_blocks", b.published_blocks},
                       {"blocks_from", {{"memory", b.fetched_from[0]},
                                        {"replica", b.fetched_from[1]},
                                        {"ssd", b.fetched_from[2]},
                                        {"remote", b.fetched_from[3]}}},
                       {"misses", std::move(misses)}};
  return json{{"servers", std::move(servers)}, {"engine", engine}}.dump();
}

}  // namespace trellis::cli
