// The --store flags `trellis serve` and `trellis run` share: how an engine reaches its
// node's prefix store server (docs/store.md, "Engines on the store").
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/store_bridge.h"

namespace trellis::cli {

struct StoreFlags {
  std::string store;        // HOST:PORT of this node's store server ("": no store)
  std::string peers;        // the other members, comma-separated (else learned from --store)
  std::string etcd;         // or the membership from etcd
  int timeout_ms = 2000;    // longest a fetch may take
  std::string tls = "tcp";  // UCX transports
  std::string net_devices;  // UCX_NET_DEVICES
  bool no_single_flight = false;
  // The store transport's poll after work before it sleeps. 0 on an engine: its cores
  // compute, and a spinning progress thread during a bulk read took ~0.25 core-s per
  // 64 MB from the compute (trellis bench store, single-flight, 4 nodes on 2 cores).
  uint32_t spin_us = 0;
  uint32_t fault_flip_landed_every = 0;  // chaos runs only (hidden flag)
};

void AddStoreFlags(CLI::App& app, StoreFlags* f);

// The bridge's options --store and its flags make; nullopt when --store is not given.
Result<std::optional<StoreBridgeOptions>> BridgeOptions(const StoreFlags& f);
// Null when --store is not given; an error when it is and no store server answers.
Result<std::unique_ptr<StoreBridge>> ConnectStore(const StoreFlags& f);
// The client options --store, --store-peers, --store-etcd and the transport flags make.
store::ClientOptions StoreClientOptions(const StoreFlags& f);

// The cache view's "store" section (docs/server.md, "The cache view"), as JSON text:
// every store server's tiers and hits (asked now, within 1 s in all) and where this
// engine's fetched blocks came from.
std::string StoreViewJson(StoreBridge& bridge);

}  // namespace trellis::cli
