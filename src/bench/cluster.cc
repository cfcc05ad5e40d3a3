#include "bench/cluster.h"

#include <signal.h>
#include <errno.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace trellis::bench {
namespace {

constexpr int kMtu = 65000;

// Runs a shell command quietly; its stderr goes into `err` when it fails.
bool Sh(const std::string& cmd, std::string* err) {
  const std::string full = cmd + " 2>&1";
  std::string out;
  FILE* p = popen(full.c_str(), "r");
  if (!p) {
    *err = "cannot run: " + cmd;
    return false;
  }
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  if (rc != 0) {
    while (!out.empty() && out.back() == '\n') out.pop_back();
    *err = cmd + ": " + (out.empty() ? "exit status " + std::to_string(rc) : out);
    return false;
  }
  return true;
}

std::string FindIp() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// Namespaces and bridges named by a process that no longer exists.
void RemoveStale(const std::string& ip) {
  FILE* p = popen((ip + " netns list 2>/dev/null").c_str(), "r");
  if (!p) return;
  char line[256];
  std::vector<std::string> stale_ns;
  std::vector<int> stale_pids;
  while (fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string name;
    in >> name;
    int pid = 0, node = 0;
    if (std::sscanf(name.c_str(), "trellis-b%d-%d", &pid, &node) != 2) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    stale_ns.push_back(name);
    stale_pids.push_back(pid);
  }
  pclose(p);
  std::string ignored;
  for (const auto& ns : stale_ns) Sh(ip + " netns del " + ns, &ignored);
  for (int pid : stale_pids) Sh(fmt::format("{} link del trb{}", ip, pid), &ignored);
}

}  // namespace

Result<std::unique_ptr<Cluster>> Cluster::Create(int nodes, const std::string& rate) {
  if (nodes < 1 || nodes > 200) return InvalidArgument("a cluster has 1 to 200 nodes");
  for (char c : rate) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.') return InvalidArgument("bad tc rate '" + rate + "'");
  }
  if (geteuid() != 0) return Unavailable("network namespaces need root");
  std::unique_ptr<Cluster> c(new Cluster());
  c->ip_exe_ = FindIp();
  if (c->ip_exe_.empty()) return Unavailable("no `ip` (iproute2) found");
  RemoveStale(c->ip_exe_);
  const int pid = static_cast<int>(getpid());
  const std::string& ip = c->ip_exe_;
  const std::string subnet = fmt::format("10.213.{}", pid % 250);
  c->bridge_ = fmt::format("trb{}", pid);
  c->rate_ = rate;
  c->device_ = "eth0";
  std::string err;
  auto sh = [&](const std::string& cmd) { return Sh(cmd, &err); };
  if (!sh(fmt::format("{} link add {} type bridge", ip, c->bridge_)) ||
      !sh(fmt::format("{} link set {} mtu {}", ip, c->bridge_, kMtu)) ||
      !sh(fmt::format("{} addr add {}.254/24 dev {}", ip, subnet, c->bridge_)) ||
      !sh(fmt::format("{} link set {} up", ip, c->bridge_))) {
    c->TearDown();
    return Unavailable("cannot make the cluster's bridge: " + err);
  }
  const std::string burst = "2mb", latency = "5ms";
  for (int i = 0; i < nodes; ++i) {
    const std::string ns = fmt::format("trellis-b{}-{}", pid, i);
    const std::string veth = fmt::format("trb{}v{}", pid, i);
    const std::string host = fmt::format("{}.{}", subnet, i + 1);
    if (!sh(fmt::format("{} netns add {}", ip, ns))) break;
    c->namespaces_.push_back(ns);
    if (!sh(fmt::format("{} link add {} mtu {} type veth peer name eth0 mtu {} netns {}", ip, veth, kMtu, kMtu, ns)) ||
        !sh(fmt::format("{} link set {} master {} up", ip, veth, c->bridge_)) ||
        !sh(fmt::format("{} -n {} addr add {}/24 dev eth0", ip, ns, host)) ||
        !sh(fmt::format("{} -n {} link set eth0 up", ip, ns)) || !sh(fmt::format("{} -n {} link set lo up", ip, ns)) ||
        !sh(fmt::format("tc qdisc add dev {} root tbf rate {} burst {} latency {}", veth, rate, burst, latency)) ||
        !sh(fmt::format("tc -n {} qdisc add dev eth0 root tbf rate {} burst {} latency {}", ns, rate, burst, latency))) {
      break;
    }
    c->hosts_.push_back(host);
  }
  if (static_cast<int>(c->hosts_.size()) != nodes) {
    c->TearDown();
    return Unavailable("cannot make the cluster's namespaces: " + err);
  }
  return c;
}

std::unique_ptr<Cluster> Cluster::Loopback(int nodes) {
  std::unique_ptr<Cluster> c(new Cluster());
  for (int i = 0; i < nodes; ++i) c->hosts_.push_back("127.0.0.1");
  return c;
}

Cluster::~Cluster() { TearDown(); }

void Cluster::TearDown() {
  std::string ignored;
  for (const auto& ns : namespaces_) Sh(ip_exe_ + " netns del " + ns, &ignored);  // takes its veth with it
  if (!bridge_.empty()) Sh(ip_exe_ + " link del " + bridge_, &ignored);
  namespaces_.clear();
  bridge_.clear();
}

Cluster::Command Cluster::On(int i, std::vector<std::string> argv) const {
  if (namespaces_.empty()) {
    std::string exe = argv.at(0);
    return {exe, std::move(argv)};
  }
  std::vector<std::string> full = {"ip", "netns", "exec", namespaces_.at(static_cast<size_t>(i))};
  full.insert(full.end(), argv.begin(), argv.end());
  return {ip_exe_, std::move(full)};
}

std::string Cluster::Describe() const {
  if (namespaces_.empty()) {
    return fmt::format("{} nodes on 127.0.0.1 (ports apart), no network namespaces, links not shaped", size());
  }
  return fmt::format("{} network namespaces joined by veth pairs to one bridge, MTU {}, tc tbf {} each way on every link",
                     size(), kMtu, rate_);
}

}  // namespace trellis::bench
