// An emulated cluster on one machine, for the distributed benchmarks (`bench store`).
//
// N nodes, each a network namespace whose one interface ("eth0", a veth pair) joins a
// bridge in the host namespace, which also has an address so the benchmark's client (in
// the host namespace) reaches every node. Both ends of every veth are shaped by `tc tbf`
// at the given rate, so each node's link carries at most that rate each way, as a NIC
// does; traffic between two processes of one node stays inside its namespace (lo) and is
// not shaped, as on a real machine. The veths and the bridge use a 65000-byte MTU: at
// 1500 the kernel's per-packet cost here caps a veth near 0.5 GB/s, below the link being
// emulated (measured on the 2-core VM of docs/BENCHMARKS.md: 0.53 GB/s at 1500, 1.1 GB/s
// at 65000 under a 10gbit tbf).
//
// Needs root and `ip`/`tc` (iproute2). Without them, Loopback() gives nodes at
// 127.0.X.i on the host's lo: no namespaces, no shaping, and Describe() says so.
//
// Names carry the creating process's pid (namespace "trellis-b<pid>-<i>", bridge
// "trb<pid>"), so two benchmarks can run at once, and Create removes what an earlier
// process that no longer exists left behind. The destructor removes everything.
//
// Thread-safety: const methods from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "util/status.h"

namespace trellis::bench {

class Cluster {
 public:
  // Namespaces joined by shaped veths. `rate` is a tc rate ("10gbit", "1gbit", ...).
  static Result<std::unique_ptr<Cluster>> Create(int nodes, const std::string& rate);
  // Nodes on 127.0.0.1 (distinct ports), in the host namespace, unshaped.
  static std::unique_ptr<Cluster> Loopback(int nodes);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  int size() const { return static_cast<int>(hosts_.size()); }
  // Node i's address (the others and the client reach it there) and its network device
  // (UCX_NET_DEVICES for processes on it).
  const std::string& host(int i) const { return hosts_[static_cast<size_t>(i)]; }
  const std::string& device() const { return device_; }
  bool shaped() const { return !namespaces_.empty(); }
  // Added to every port node i listens on: 0 in namespaces (each has its own ports);
  // i on loopback, where every node is 127.0.0.1 (UCX over lo reaches no other
  // 127.x address: "Endpoint is not connected").
  int port_offset(int i) const { return shaped() ? 0 : i; }

  // The executable and argv that run `argv` (argv[0] the program's path) on node i.
  struct Command {
    std::string exe;
    std::vector<std::string> argv;
  };
  Command On(int i, std::vector<std::string> argv) const;

  // One line for the report, e.g. "4 network namespaces on a bridge, veth MTU 65000,
  // tc tbf 10gbit each way per node".
  std::string Describe() const;

 private:
  Cluster() = default;
  void TearDown();

  std::vector<std::string> hosts_, namespaces_;
  std::string device_ = "lo", bridge_, rate_, ip_exe_;
};

}  // namespace trellis::bench
