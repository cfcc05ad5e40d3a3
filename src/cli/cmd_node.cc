// trellis node: one grid node, holding a range of a model's layers (docs/grid.md).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "engine/model.h"
#include "grid/node.h"

namespace trellis::cli {
namespace {

struct NodeOpts {
  std::string listen = "127.0.0.1:0";
  std::string model;
  std::string layers;
  int threads = 1;
  std::string tls = "tcp";
  std::string net_devices;
  uint32_t spin_us = 0;
};

int RunNode(const NodeOpts& o) {
  auto hp = ParseHostPort(o.listen, "--listen");
  if (!hp.ok()) return Fail(hp.status().message());
  // "A-B" (inclusive) or "A".
  const size_t dash = o.layers.find('-');
  const std::string a = o.layers.substr(0, dash), b = dash == std::string::npos ? a : o.layers.substr(dash + 1);
  auto digits = [](const std::string& s) { return !s.empty() && s.size() < 7 && s.find_first_not_of("0123456789") == std::string::npos; };
  if (!digits(a) || !digits(b) || std::stoi(b) < std::stoi(a)) return Fail("--layers takes FIRST-LAST (inclusive), got '" + o.layers + "'");
  if (o.threads < 1 || o.threads > 256) return Fail("--threads must be in 1..256");
  const ModelPart part{.first_layer = std::stoi(a), .last_layer = std::stoi(b) + 1, .embed = false, .head = false};
  auto model = Model::Load(o.model, part);
  if (!model.ok()) return Fail(model.status().ToString());

  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  grid::NodeOptions no;
  no.host = hp->first;
  no.port = hp->second;
  no.threads = o.threads;
  no.transport.tls = o.tls;
  no.transport.net_devices = o.net_devices;
  no.transport.spin_us = o.spin_us;
  auto node = grid::GridNode::Start(**model, no);
  if (!node.ok()) return Fail("node: " + node.status().ToString());
  const ModelConfig& c = (*model)->config();
  std::fprintf(stderr, "trellis node: listening on %s:%u | model %s, layers %d-%d of 0-%d (%s, %.1f MiB) | threads %d\n",
               no.host.c_str(), (*node)->port(), o.model.c_str(), part.first_layer, part.last_layer - 1, c.n_layer - 1,
               (*model)->TypeSummary().c_str(), static_cast<double>((*model)->WeightBytes()) / (1 << 20), o.threads);
  std::fflush(stderr);
  int sig = 0;
  sigwait(&sigs, &sig);
  const grid::NodeStats st = (*node)->stats();
  std::fprintf(stderr, "trellis node: %s, stopping | %llu steps, %llu tokens, %.2f s computing, %llu hellos (%llu refused), %llu steps refused\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<unsigned long long>(st.steps),
               static_cast<unsigned long long>(st.tokens), st.compute_seconds, static_cast<unsigned long long>(st.hellos),
               static_cast<unsigned long long>(st.refused_hellos), static_cast<unsigned long long>(st.refused_steps));
  node->reset();
  return 0;
}

}  // namespace

Runner AddNodeCommand(CLI::App& app) {
  auto o = std::make_shared<NodeOpts>();
  app.add_option("-m,--model", o->model, "GGUF model file (the same file as the head's)")->required();
  app.add_option("--layers", o->layers, "the layers this node holds, FIRST-LAST (inclusive, counting from 0)")->required();
  app.add_option("--listen", o->listen, "HOST:PORT the head connects to (port 0: any; the log names it)")->capture_default_str();
  app.add_option("-t,--threads", o->threads, "compute threads")->capture_default_str();
  app.add_option("--tls", o->tls, "UCX transports (UCX_TLS)")->capture_default_str();
  app.add_option("--net-devices", o->net_devices, "UCX_NET_DEVICES (e.g. lo on one host)");
  app.add_option("--spin-us", o->spin_us, "microseconds the transport polls after work before it sleeps")->capture_default_str();
  return [o] { return RunNode(*o); };
}

}  // namespace trellis::cli
