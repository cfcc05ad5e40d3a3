// trellis store: one node's prefix tensor store server (docs/store.md).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "store/server.h"

namespace trellis::cli {
namespace {

struct StoreOptions {
  std::string listen = "127.0.0.1:0";
  std::string mem = "1G";
  uint32_t max_lease_ms = 10000;
  std::string tls = "tcp";
  std::string net_devices;
};

// "64M", "2G", "4096": bytes. K/M/G/T are powers of 1024.
Result<uint64_t> ParseSize(const std::string& s) {
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  if (digits == 0 || digits > 15) return InvalidArgument("'" + s + "' is not a size (like 512M or 2G)");
  uint64_t v = std::stoull(s.substr(0, digits));
  const std::string unit = s.substr(digits);
  int shift = 0;
  if (unit == "K" || unit == "k" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "m" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "g" || unit == "GiB") shift = 30;
  else if (unit == "T" || unit == "t" || unit == "TiB") shift = 40;
  else if (!unit.empty()) return InvalidArgument("'" + s + "': unknown size unit '" + unit + "' (K, M, G, T)");
  if (v > (UINT64_MAX >> shift)) return InvalidArgument("'" + s + "' is too large");
  return v << shift;
}

int Run(const StoreOptions& o) {
  store::ServerOptions so;
  const size_t colon = o.listen.rfind(':');
  if (colon == std::string::npos) return Fail("--listen takes HOST:PORT, got '" + o.listen + "'");
  so.host = o.listen.substr(0, colon);
  const std::string port = o.listen.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return Fail("--listen: '" + port + "' is not a port");
  }
  so.port = static_cast<uint16_t>(std::stoi(port));
  auto mem = ParseSize(o.mem);
  if (!mem.ok()) return Fail("--mem: " + mem.status().message());
  so.mem_bytes = *mem;
  so.max_lease_ms = o.max_lease_ms;
  so.transport.tls = o.tls;
  so.transport.net_devices = o.net_devices;

  // Signals are taken by sigwait below, so block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto server = store::StoreServer::Start(so);
  if (!server.ok()) return Fail("store: " + server.status().ToString());
  std::fprintf(stderr, "trellis store: listening on %s:%u, memory %llu bytes, transports %s\n", so.host.c_str(),
               (*server)->port(), static_cast<unsigned long long>(so.mem_bytes), so.transport.tls.c_str());
  std::fflush(stderr);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "trellis store: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fputs((*server)->MetricsText().c_str(), stderr);
  server->reset();
  std::fprintf(stderr, "trellis store: stopped\n");
  return 0;
}

}  // namespace

Runner AddStoreCommand(CLI::App& app) {
  auto o = std::make_shared<StoreOptions>();
  app.add_option("--listen", o->listen, "HOST:PORT to serve the store on (port 0: any; the log names it)")
      ->capture_default_str();
  app.add_option("--mem", o->mem, "memory tier size (K, M, G suffixes)")->capture_default_str();
  app.add_option("--max-lease-ms", o->max_lease_ms, "longest a reader may pin a tensor")->capture_default_str();
  app.add_option("--tls", o->tls, "UCX transports (UCX_TLS); tcp is needed to accept connections")->capture_default_str();
  app.add_option("--net-devices", o->net_devices, "UCX_NET_DEVICES (e.g. lo for a single-host test)");
  return [o] { return Run(*o); };
}

}  // namespace trellis::cli
