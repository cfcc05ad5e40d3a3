#include "cli/store_flags.h"

#include <sstream>

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

}  // namespace trellis::cli
