#include "cli/grid_flags.h"

#include <map>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model_config.h"
#include "store/etcd.h"

namespace trellis::cli {

void AddGridFlags(CLI::App& app, GridFlags* f) {
  app.add_option("--grid", f->grid,
                 "run the model's layers on grid nodes: HOST:PORT=FIRST-LAST,... in layer order (started with "
                 "`trellis node`); this process keeps the embeddings, the output head and the layers before the first node's");
  app.add_option("--grid-etcd", f->etcd,
                 "take the grid's nodes from etcd (http://HOST:PORT), where `trellis node --etcd` registered them");
  app.add_option("--grid-depth", f->depth, "micro-batches in flight through the grid")->capture_default_str();
  app.add_option("--grid-chunk", f->chunk, "prefill chunk with --grid (a prompt's chunks follow each other through the nodes)")
      ->capture_default_str();
  app.add_option("--grid-timeout", f->timeout, "seconds a node may take for one step before it is declared failed")
      ->capture_default_str();
  app.add_option("--grid-start-timeout", f->start_timeout, "seconds to wait for every node at start-up")
      ->capture_default_str();
  app.add_option("--grid-tls", f->tls, "UCX transports to the nodes (UCX_TLS)")->capture_default_str();
  app.add_option("--grid-net-devices", f->net_devices, "UCX_NET_DEVICES to the nodes (e.g. lo on one host)");
}

// Registered nodes -> a chain ending at the model's last layer: from the last layer back,
// each link the node whose last layer is one before the previous link's first (the
// smallest address when several qualify). "" when there is none.
std::string ChainFromEtcd(const std::vector<std::pair<std::string, std::string>>& entries, int n_layer) {
  std::map<int, std::vector<std::pair<int, std::string>>> by_last;  // last -> (first, address)
  for (const auto& [addr, value] : entries) {
    int first = -1, last = -1;
    if (std::sscanf(value.c_str(), "%d-%d", &first, &last) != 2 || first < 0 || last < first || last >= n_layer) continue;
    by_last[last].emplace_back(first, addr);
  }
  std::vector<std::string> chain;
  int want = n_layer - 1;
  while (want >= 0) {
    auto it = by_last.find(want);
    if (it == by_last.end()) break;
    auto best = std::min_element(it->second.begin(), it->second.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    chain.insert(chain.begin(), fmt::format("{}={}-{}", best->second, best->first, want));
    want = best->first - 1;
  }
  if (want == n_layer - 1) return "";
  std::string spec;
  for (const auto& c : chain) spec += (spec.empty() ? "" : ",") + c;
  return spec;
}

Status DiscoverGrid(GridFlags& f, const std::string& model_path) {
  if (f.etcd.empty()) return Status::Ok();
  if (!f.grid.empty()) return InvalidArgument("give --grid or --grid-etcd, not both");
  TRELLIS_ASSIGN_OR_RETURN(store::Etcd etcd, store::Etcd::Parse(f.etcd, store::Etcd::kGridPrefix));
  TRELLIS_ASSIGN_OR_RETURN(GgufFile g, GgufFile::Open(model_path));
  TRELLIS_ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::FromGguf(g));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(f.start_timeout * 1000));
  std::string last_seen = "no node";
  for (;;) {
    auto entries = etcd.Entries();
    if (entries.ok()) {
      f.grid = ChainFromEtcd(*entries, c.n_layer);
      if (!f.grid.empty()) return Status::Ok();
      last_seen = fmt::format("{} node(s) registered, none ending at layer {}", entries->size(), c.n_layer - 1);
      if (!entries->empty()) {
        last_seen = fmt::format("{} node(s) registered ({}), not covering layers up to {} without a gap", entries->size(),
                                (*entries)[0].first + "=" + (*entries)[0].second + (entries->size() > 1 ? ", ..." : ""),
                                c.n_layer - 1);
      }
    } else {
      last_seen = entries.status().message();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Unavailable(fmt::format("--grid-etcd {}: no grid after {} s: {}", f.etcd, f.start_timeout, last_seen));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Result<ModelPart> HeadPart(const GridFlags& f) {
  if (f.grid.empty()) return ModelPart{};
  TRELLIS_ASSIGN_OR_RETURN(std::vector<grid::NodeAddress> nodes, grid::ParseGridSpec(f.grid));
  return ModelPart{.first_layer = 0, .last_layer = nodes.front().first_layer, .embed = true, .head = true};
}

Status ConfigureGrid(const GridFlags& f, const Model& model, SchedulerOptions& o, grid::GridHead** head,
                     grid::GridPrefixStore* store) {
  if (f.grid.empty()) return Status::Ok();
  if (f.depth < 1 || f.depth > 16) return InvalidArgument("--grid-depth must be in 1..16");
  if (f.chunk < 1) return InvalidArgument("--grid-chunk must be >= 1");
  if (!(f.timeout > 0 && f.timeout <= 86400) || !(f.start_timeout >= 0 && f.start_timeout <= 86400)) {
    return InvalidArgument("--grid-timeout and --grid-start-timeout must be in (0, 86400] seconds");
  }
  grid::HeadOptions ho;
  TRELLIS_ASSIGN_OR_RETURN(ho.nodes, grid::ParseGridSpec(f.grid));
  ho.depth = f.depth;
  ho.step_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout * 1000));
  ho.start_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.start_timeout * 1000));
  ho.transport.tls = f.tls;
  ho.transport.net_devices = f.net_devices;
  ho.transport.spin_us = f.spin_us;
  ho.store = o.store != nullptr;
  o.executor = grid::MakeGridExecutor(model, ho, head, store);
  o.prefill_chunk = std::min(o.prefill_chunk, f.chunk);
  // Steps stay small in a pipeline (a prompt's chunks follow each other through the
  // nodes), and every node sizes its activations by this.
  o.max_batch_tokens = std::min(o.max_batch_tokens, std::max(2 * f.chunk, o.max_running));
  return Status::Ok();
}

std::string GridMetricsText(const grid::GridHead& head) {
  const grid::HeadStats s = head.stats();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  metric("trellis_grid_healthy", "gauge", "1 when every grid node is up", head.health().ok ? 1 : 0);
  metric("trellis_grid_steps_total", "counter", "micro-batches launched through the grid", static_cast<double>(s.steps));
  metric("trellis_grid_tokens_total", "counter", "token rows launched through the grid", static_cast<double>(s.tokens));
  metric("trellis_grid_bytes_sent_total", "counter", "step bytes sent to the nodes", static_cast<double>(s.bytes_sent));
  metric("trellis_grid_bytes_received_total", "counter", "hidden-state bytes the nodes answered",
         static_cast<double>(s.bytes_received));
  metric("trellis_grid_node_failures_total", "counter", "nodes declared failed", static_cast<double>(s.node_failures));
  metric("trellis_grid_rejoins_total", "counter", "failed nodes that came back", static_cast<double>(s.rejoins));
  metric("trellis_grid_store_node_fetches_total", "counter", "store fetches the nodes ran for the head (one per node)",
         static_cast<double>(s.node_fetches));
  metric("trellis_grid_store_fetch_failures_total", "counter", "store fetches some node could not complete",
         static_cast<double>(s.node_fetch_failures));
  metric("trellis_grid_store_gathered_bytes_total", "counter", "bytes of the nodes' layers gathered for publishing",
         static_cast<double>(s.gathered_bytes));
  metric("trellis_grid_head_layers_seconds_total", "counter", "engine thread time in the head's own layers", s.layers_seconds);
  metric("trellis_grid_head_wait_seconds_total", "counter", "engine thread time waiting for the nodes", s.wait_seconds);
  metric("trellis_grid_head_logits_seconds_total", "counter", "engine thread time in the output head", s.logits_seconds);
  out += "# HELP trellis_grid_node_rtt_seconds round trip of an empty message to each node, at connect\n"
         "# TYPE trellis_grid_node_rtt_seconds gauge\n";
  for (size_t i = 0; i < s.rtt_seconds.size(); ++i) {
    out += fmt::format("trellis_grid_node_rtt_seconds{{node=\"{}\"}} {}\n", i, s.rtt_seconds[i]);
  }
  out += "# HELP trellis_grid_node_bandwidth_bytes_per_second each node's link, from 1 MiB round trips at connect\n"
         "# TYPE trellis_grid_node_bandwidth_bytes_per_second gauge\n";
  for (size_t i = 0; i < s.bandwidth.size(); ++i) {
    out += fmt::format("trellis_grid_node_bandwidth_bytes_per_second{{node=\"{}\"}} {}\n", i, s.bandwidth[i]);
  }
  return out;
}

std::string GridViewJson(const grid::GridHead& head, int head_layers) {
  using nlohmann::json;
  const grid::HeadStats s = head.stats();
  const grid::HeadHealth h = head.health();
  json nodes = json::array();
  for (size_t i = 0; i < s.nodes.size(); ++i) {
    const grid::HeadStats::Node& n = s.nodes[i];
    nodes.push_back({{"address", n.address},
                     {"layers", {n.first_layer, n.last_layer - 1}},
                     {"up", n.up},
                     {"steps", n.steps},
                     {"step_seconds", n.step_seconds},
                     {"failures", n.failures},
                     {"rtt_seconds", i < s.rtt_seconds.size() ? s.rtt_seconds[i] : 0.0},
                     {"bandwidth", i < s.bandwidth.size() ? s.bandwidth[i] : 0.0}});
  }
  json j = {{"healthy", h.ok},
            {"message", h.message},
            {"head", {{"layers", head_layers > 0 ? json::array({0, head_layers - 1}) : json(nullptr)},
                      {"layers_seconds", s.layers_seconds},
                      {"wait_seconds", s.wait_seconds},
                      {"logits_seconds", s.logits_seconds}}},
            {"steps", s.steps},
            {"tokens", s.tokens},
            {"node_failures", s.node_failures},
            {"rejoins", s.rejoins},
            {"nodes", std::move(nodes)}};
  return j.dump();
}

}  // namespace trellis::cli
