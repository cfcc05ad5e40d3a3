// trellis node: one grid node, holding a range of a model's layers (docs/grid.md).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <string>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/kv_flags.h"
#include "cli/store_flags.h"
#include "engine/model.h"
#include "grid/node.h"
#include "store/etcd.h"

namespace trellis::cli {
namespace {

struct NodeOpts {
  std::string listen = "127.0.0.1:0";
  std::string model;
  std::string layers;
  int threads = 0;  // 0: the physical cores this process may use
  std::string tls = "tcp";
  std::string net_devices;
  uint32_t spin_us = 0;
  std::string etcd, advertise;
  int etcd_ttl = 5;
  int64_t max_kv_memory = 0;
  uint32_t max_batch_tokens = 8192;
  StoreFlags store;
  KvTypeFlags kv_types;  // empty: the head's
};

// Keeps "/trellis/grid/nodes/<advertise>" = "FIRST-LAST FINGERPRINT" alive in etcd under a
// lease (renewed every third of its TTL, registered again if it lapsed), so a head started
// with --grid-etcd finds this node; revoked when the node stops.
class EtcdRegistration {
 public:
  EtcdRegistration(store::Etcd etcd, std::string address, std::string value, int ttl)
      : etcd_(std::move(etcd)), address_(std::move(address)), value_(std::move(value)), ttl_(ttl) {}
  Status Start() {
    auto lease = etcd_.Register(address_, ttl_, value_);
    if (!lease.ok()) return lease.status();
    lease_ = *lease;
    thread_ = std::thread([this] { Loop(); });
    return Status::Ok();
  }
  ~EtcdRegistration() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (lease_ != 0) (void)etcd_.Revoke(lease_);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    while (!cv_.wait_for(l, std::chrono::milliseconds(ttl_ * 1000 / 3), [&] { return stop_; })) {
      if (etcd_.KeepAlive(lease_).ok()) continue;
      auto lease = etcd_.Register(address_, ttl_, value_);
      if (lease.ok()) lease_ = *lease;  // else: etcd is away; try again next time
    }
  }
  store::Etcd etcd_;
  std::string address_, value_;
  int ttl_;
  int64_t lease_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

int RunNode(const NodeOpts& o) {
  auto hp = ParseHostPort(o.listen, "--listen");
  if (!hp.ok()) return Fail(hp.status().message());
  // "A-B" (inclusive) or "A".
  const size_t dash = o.layers.find('-');
  const std::string a = o.layers.substr(0, dash), b = dash == std::string::npos ? a : o.layers.substr(dash + 1);
  auto digits = [](const std::string& s) { return !s.empty() && s.size() < 7 && s.find_first_not_of("0123456789") == std::string::npos; };
  if (!digits(a) || !digits(b) || std::stoi(b) < std::stoi(a)) return Fail("--layers takes FIRST-LAST (inclusive), got '" + o.layers + "'");
  if (o.threads < 0 || o.threads > 1024) return Fail("--threads must be in 1..1024 (0 = the physical cores available)");
  const ModelPart part{.first_layer = std::stoi(a), .last_layer = std::stoi(b) + 1, .embed = false, .head = false};
  auto model = Model::Load(o.model, part);
  if (!model.ok()) return Fail(model.status().ToString());

  sigset_t sigs = BlockStopSignals();

  grid::NodeOptions no;
  no.host = hp->first;
  no.port = hp->second;
  std::string threads_how;
  const int threads = ResolveThreads(o.threads, &threads_how);
  no.threads = threads;
  if (o.max_kv_memory < 0) return Fail("--max-kv-memory must be >= 0");
  no.max_kv_bytes = static_cast<uint64_t>(o.max_kv_memory);
  no.max_batch_tokens = o.max_batch_tokens;
  if (o.kv_types.k.empty() != o.kv_types.v.empty()) return Fail("--cache-type-k and --cache-type-v go together on a node");
  if (!o.kv_types.k.empty()) no.kv_types = KvLayout{0, 0, 0, 0, o.kv_types.K(), o.kv_types.V()}.TypeCode();
  no.transport.tls = o.tls;
  no.transport.net_devices = o.net_devices;
  no.transport.spin_us = o.spin_us;
  if (!o.store.store.empty()) {
    no.store = StoreClientOptions(o.store);
  } else if (!o.store.peers.empty() || !o.store.etcd.empty()) {
    return Fail("--store-peers and --store-etcd need --store");
  }
  auto node = grid::GridNode::Start(**model, no);
  if (!node.ok()) return Fail("node: " + node.status().ToString());
  const ModelConfig& c = (*model)->config();
  std::fprintf(stderr, "trellis node: listening on %s:%u | model %s, layers %d-%d of 0-%d (%s, %.1f MiB) | %s\n",
               no.host.c_str(), (*node)->port(), o.model.c_str(), part.first_layer, part.last_layer - 1, c.n_layer - 1,
               (*model)->TypeSummary().c_str(), static_cast<double>((*model)->WeightBytes()) / (1 << 20),
               ThreadsText(threads, threads_how).c_str());
  if (!o.store.store.empty()) std::fprintf(stderr, "trellis node: prefix store %s\n", o.store.store.c_str());
  std::unique_ptr<EtcdRegistration> reg;
  if (!o.etcd.empty()) {
    auto etcd = store::Etcd::Parse(o.etcd, store::Etcd::kGridPrefix);
    if (!etcd.ok()) return Fail(etcd.status().message());
    std::string adv = o.advertise;
    if (adv.empty()) {
      if (no.host == "0.0.0.0" || no.host == "::") return Fail("--etcd with --listen on every address needs --advertise HOST:PORT");
      adv = fmt::format("{}:{}", no.host, (*node)->port());
    }
    if (!store::IsHostPort(adv)) return Fail("--advertise takes HOST:PORT, got '" + adv + "'");
    reg = std::make_unique<EtcdRegistration>(*etcd, adv,
                                             fmt::format("{}-{} {:016x}", part.first_layer, part.last_layer - 1,
                                                         (*model)->fingerprint()),
                                             std::max(1, o.etcd_ttl));
    if (Status st = reg->Start(); !st.ok()) return Fail("--etcd: " + st.ToString());
    std::fprintf(stderr, "trellis node: registered in etcd %s as %s\n", o.etcd.c_str(), adv.c_str());
  }
  std::fflush(stderr);
  int sig = 0;
  sigwait(&sigs, &sig);
  reg.reset();
  const grid::NodeStats st = (*node)->stats();
  std::fprintf(stderr, "trellis node: %s, stopping | %llu steps, %llu tokens, %.2f s computing, %llu hellos (%llu refused), %llu steps refused | store: %llu fetches (%llu failed), %llu blocks read, %llu given for publishing\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<unsigned long long>(st.steps),
               static_cast<unsigned long long>(st.tokens), st.compute_seconds, static_cast<unsigned long long>(st.hellos),
               static_cast<unsigned long long>(st.refused_hellos), static_cast<unsigned long long>(st.refused_steps),
               static_cast<unsigned long long>(st.fetches), static_cast<unsigned long long>(st.fetch_failures),
               static_cast<unsigned long long>(st.fetched_blocks), static_cast<unsigned long long>(st.read_blocks));
  node->reset();
  return 0;
}

}  // namespace

Runner AddNodeCommand(CLI::App& app) {
  auto o = std::make_shared<NodeOpts>();
  app.add_option("-m,--model", o->model, "GGUF model file (the same file as the head's)")->required();
  app.add_option("--layers", o->layers, "the layers this node holds, FIRST-LAST (inclusive, counting from 0)")->required();
  app.add_option("--listen", o->listen, "HOST:PORT the head connects to (port 0: any; the log names it)")->capture_default_str();
  app.add_option("-t,--threads", o->threads, kThreadsHelp);
  app.add_option("--tls", o->tls, "UCX transports (UCX_TLS)")->capture_default_str();
  app.add_option("--net-devices", o->net_devices, "UCX_NET_DEVICES (e.g. lo on one host)");
  app.add_option("--spin-us", o->spin_us, "microseconds the transport polls after work before it sleeps")->capture_default_str();
  app.add_option("--max-kv-memory", o->max_kv_memory,
                 "largest KV pool a head may ask this node for, K/M/G suffixes (0: 90% of available memory)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-batch-tokens", o->max_batch_tokens, "largest step (tokens) a head may ask for")->capture_default_str();
  AddKvTypeFlags(app, &o->kv_types, /*node=*/true);
  app.add_option("--etcd", o->etcd, "etcd (http://HOST:PORT): register here, so a head started with --grid-etcd finds this node");
  app.add_option("--advertise", o->advertise, "HOST:PORT the head reaches this node at (default: --listen's)");
  app.add_option("--store", o->store.store,
                 "this machine's prefix store server (HOST:PORT): a head started with --store has every node read its "
                 "layers of a stored prefix itself");
  app.add_option("--store-peers", o->store.peers, "the other store servers, comma-separated (default: what --store knows)");
  app.add_option("--store-etcd", o->store.etcd, "etcd URL the store servers register in (membership)");
  app.add_option("--store-net-devices", o->store.net_devices, "UCX_NET_DEVICES for the store (e.g. lo on one host)");
  app.add_option("--etcd-ttl", o->etcd_ttl, "seconds the etcd registration outlives a silent node")->capture_default_str();
  return [o] { return RunNode(*o); };
}

}  // namespace trellis::cli
