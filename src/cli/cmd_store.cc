// trellis store: one node's prefix tensor store server (docs/store.md).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <algorithm>
#include <string>
#include <vector>

#include <thread>

#include "cli/commands.h"
#include "http/server.h"
#include "store/server.h"

namespace trellis::cli {
namespace {

struct StoreOptions {
  std::string listen = "127.0.0.1:0";
  std::string mem = "1G";
  uint32_t max_lease_ms = 10000;
  std::string tls = "tcp";
  std::string net_devices;
  uint32_t spin_us = 0;
  uint32_t fault_flip_landed_every = 0;  // chaos runs only (hidden flag)
  std::string ssd_dir, ssd_size;
  double replica_share = 0.25;
  uint32_t replica_after_reads = 2;
  std::vector<std::string> peers;
  std::string etcd, advertise;
  int etcd_ttl = 5;
  std::string metrics_listen;  // HOST:PORT of the /metrics and /health endpoint; "" = none
};

// GET /metrics (Prometheus text) and GET /health, answered from the head on the HTTP
// server's I/O thread; everything else is 404 / 405.
class MetricsHandler : public http::HttpHandler {
 public:
  explicit MetricsHandler(const store::StoreServer& s) : store_(s) {}
  std::optional<http::HttpResponse> OnHead(const http::HttpRequest& head) override {
    http::HttpResponse r;
    if (head.path != "/metrics" && head.path != "/health") {
      r.status = 404;
      r.body = ErrorBody(404, "not found: the store serves GET /metrics and GET /health");
      return r;
    }
    if (head.method != "GET") {
      r.status = 405;
      r.headers.emplace_back("Allow", "GET");
      r.body = ErrorBody(405, "use GET");
      return r;
    }
    if (head.path == "/health") {
      r.body = R"({"status":"ok"})";
      return r;
    }
    r.content_type = "text/plain; version=0.0.4";
    r.body = store_.MetricsText();
    return r;
  }
  void Handle(const http::HttpRequest&, http::HttpExchange& ex) override {
    http::HttpResponse r;
    r.status = 404;
    r.body = ErrorBody(404, "not found");
    ex.Respond(r);
  }
  void OnAnswered(const http::HttpRequest&, int, const http::AccessInfo&, double) override {}
  std::string ErrorBody(int status, const std::string& message) const override {
    std::string m;
    for (char c : message) m += (c == '"' || c == '\\') ? ' ' : c;
    return "{\"error\":{\"code\":" + std::to_string(status) + ",\"message\":\"" + m + "\"}}";
  }

 private:
  const store::StoreServer& store_;
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
  auto hp = ParseHostPort(o.listen, "--listen");
  if (!hp.ok()) return Fail(hp.status().message());
  so.host = hp->first;
  so.port = hp->second;
  auto mem = ParseSize(o.mem);
  if (!mem.ok()) return Fail("--mem: " + mem.status().message());
  so.mem_bytes = *mem;
  so.max_lease_ms = o.max_lease_ms;
  so.replica_share = o.replica_share;
  so.replica_after_reads = std::max<uint32_t>(1, o.replica_after_reads);
  so.peers = o.peers;
  so.etcd = o.etcd;
  so.etcd_ttl_s = std::max(1, o.etcd_ttl);
  so.advertise = o.advertise;
  if (!o.ssd_dir.empty()) {
    if (o.ssd_size.empty()) return Fail("--ssd-dir needs --ssd-size");
    auto ssd = ParseSize(o.ssd_size);
    if (!ssd.ok()) return Fail("--ssd-size: " + ssd.status().message());
    so.ssd_dir = o.ssd_dir;
    so.ssd_bytes = *ssd;
  } else if (!o.ssd_size.empty()) {
    return Fail("--ssd-size needs --ssd-dir");
  }
  so.transport.tls = o.tls;
  so.transport.net_devices = o.net_devices;
  so.transport.spin_us = o.spin_us;
  so.transport.fault_flip_landed_every = o.fault_flip_landed_every;

  // Signals are taken by sigwait below, so block them before any thread starts.
  sigset_t sigs = BlockStopSignals();

  auto server = store::StoreServer::Start(so);
  if (!server.ok()) return Fail("store: " + server.status().ToString());
  std::fprintf(stderr, "trellis store: listening on %s:%u, memory %llu bytes, transports %s\n", so.host.c_str(),
               (*server)->port(), static_cast<unsigned long long>(so.mem_bytes), so.transport.tls.c_str());
  if (!so.ssd_dir.empty()) {
    const store::ServerStats st = (*server)->stats();
    std::fprintf(stderr, "trellis store: SSD tier %s, %llu bytes: %llu tensors restored, %llu bad files deleted\n",
                 so.ssd_dir.c_str(), static_cast<unsigned long long>(so.ssd_bytes),
                 static_cast<unsigned long long>(st.ssd_restored), static_cast<unsigned long long>(st.ssd_rejected));
  }
  std::unique_ptr<MetricsHandler> handler;
  std::unique_ptr<http::HttpServer> http;
  std::thread http_thread;
  if (!o.metrics_listen.empty()) {
    const size_t mc = o.metrics_listen.rfind(':');
    if (mc == std::string::npos) return Fail("--metrics-listen takes HOST:PORT, got '" + o.metrics_listen + "'");
    http::HttpServerOptions ho;
    ho.host = o.metrics_listen.substr(0, mc);
    ho.port = std::atoi(o.metrics_listen.c_str() + mc + 1);
    ho.workers = 1;
    ho.max_queued = 4;
    handler = std::make_unique<MetricsHandler>(**server);
    http = std::make_unique<http::HttpServer>(*handler, ho);
    if (Status b = http->Bind(); !b.ok()) return Fail("--metrics-listen: " + b.ToString());
    std::fprintf(stderr, "trellis store: metrics on http://%s:%d/metrics\n", ho.host.c_str(), http->port());
    http_thread = std::thread([&] { http->Run(); });
  }
  std::fflush(stderr);
  int sig = 0;
  sigwait(&sigs, &sig);
  if (http) {
    http->BeginShutdown();
    http_thread.join();
  }
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
  app.add_option("--replica-share", o->replica_share, "share of --mem that replicas of other nodes' tensors may use")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--replica-after-reads", o->replica_after_reads,
                 "local reads of another node's tensor before it is copied here")
      ->capture_default_str();
  app.add_option("--peers", o->peers, "HOST:PORT of the other store servers (replicas are copied from them)")
      ->delimiter(',');
  app.add_option("--etcd", o->etcd, "etcd (http://HOST:PORT): register here under a lease, take peers from here");
  app.add_option("--etcd-ttl", o->etcd_ttl, "seconds the etcd registration outlives a silent server")->capture_default_str();
  app.add_option("--advertise", o->advertise, "HOST:PORT others reach this server at (default: --listen's)");
  app.add_option("--ssd-dir", o->ssd_dir, "directory of the SSD tier (kept across restarts)");
  app.add_option("--ssd-size", o->ssd_size, "SSD tier size (K, M, G, T suffixes)");
  app.add_option("--max-lease-ms", o->max_lease_ms, "longest a reader may pin a tensor")->capture_default_str();
  app.add_option("--tls", o->tls, "UCX transports (UCX_TLS); tcp is needed to accept connections")->capture_default_str();
  app.add_option("--net-devices", o->net_devices, "UCX_NET_DEVICES (e.g. lo for a single-host test)");
  app.add_option("--spin-us", o->spin_us,
                 "microseconds the server keeps polling after work before it sleeps (0: sleep at once; polling "
                 "takes CPU from the engine on the same node)")
      ->capture_default_str();
  app.add_option("--metrics-listen", o->metrics_listen, "HOST:PORT for GET /metrics (Prometheus) and /health");
  // Chaos runs only (tests/chaos): not in --help.
  app.add_option("--fault-flip-landed", o->fault_flip_landed_every,
                 "flip a byte in every Nth segment read from a writer or a peer, after the transport (fault injection)")
      ->group("");
  return [o] { return Run(*o); };
}

}  // namespace trellis::cli
