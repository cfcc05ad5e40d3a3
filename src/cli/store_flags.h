// The --store flags `trellis serve` and `trellis run` share: how an engine reaches its
// node's prefix store server (docs/store.md, "Engines on the store").
#pragma once

#include <memory>
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
};

void AddStoreFlags(CLI::App& app, StoreFlags* f);

// Null when --store is not given; an error when it is and no store server answers.
Result<std::unique_ptr<StoreBridge>> ConnectStore(const StoreFlags& f);

}  // namespace trellis::cli
