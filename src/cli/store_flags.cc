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
}

Result<std::unique_ptr<StoreBridge>> ConnectStore(const StoreFlags& f) {
  if (f.store.empty()) {
    if (!f.peers.empty() || !f.etcd.empty()) return InvalidArgument("--store-peers and --store-etcd need --store");
    return std::unique_ptr<StoreBridge>();
  }
  if (f.timeout_ms < 1 || f.timeout_ms > 600000) return InvalidArgument("--store-timeout-ms must be in 1..600000");
  StoreBridgeOptions o;
  o.client.servers.push_back(f.store);
  o.client.local = f.store;
  std::stringstream ss(f.peers);
  for (std::string p; std::getline(ss, p, ',');) {
    if (!p.empty() && p != f.store) o.client.servers.push_back(p);
  }
  o.client.etcd = f.etcd;
  o.client.transport.tls = f.tls;
  o.client.transport.net_devices = f.net_devices;
  o.client.transport.spin_us = f.spin_us;
  o.fetch_timeout = std::chrono::milliseconds(f.timeout_ms);
  o.single_flight = !f.no_single_flight;
  auto b = StoreBridge::Connect(o);
  if (!b.ok()) return Unavailable("--store " + f.store + ": " + b.status().ToString());
  return b;
}

}  // namespace trellis::cli
