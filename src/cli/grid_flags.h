// `trellis serve`'s grid flags (docs/grid.md): which nodes hold which layers, and how the
// head talks to them.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/model.h"
#include "engine/scheduler.h"
#include "grid/head.h"

namespace trellis::cli {

struct GridFlags {
  std::string grid;             // HOST:PORT=A-B,... ("": no grid)
  std::string etcd;             // or: the nodes registered in this etcd (trellis node --etcd)
  int depth = 2;                // micro-batches in flight
  int chunk = 64;               // prefill chunk with a grid: a prompt's chunks follow each other through the nodes
  double timeout = 60;          // seconds a node may take for one step
  double start_timeout = 30;    // seconds to wait for every node at start-up
  std::string tls = "tcp";
  std::string net_devices;
  uint32_t spin_us = 0;
};

void AddGridFlags(CLI::App& app, GridFlags* f);

// With --grid-etcd: waits (up to --grid-start-timeout) until the nodes registered there
// cover the model's last layers without a gap, and sets f.grid to them. `model_path` is
// read for its layer count. No-op otherwise.
Status DiscoverGrid(GridFlags& f, const std::string& model_path);

// The part of the model this process holds: the whole model without --grid, else the
// embeddings, the output head and the layers before the first node's.
Result<ModelPart> HeadPart(const GridFlags& f);

// Sets o.executor (and the prefill chunk) for --grid; *head receives the head once the
// scheduler has made it. No-op without --grid.
Status ConfigureGrid(const GridFlags& f, const Model& model, SchedulerOptions& o, grid::GridHead** head,
                     grid::GridPrefixStore* store = nullptr);

// The head's counters as Prometheus text (trellis_grid_*).
std::string GridMetricsText(const grid::GridHead& head);
// The cache view's "grid" section, as JSON text: health, the head's layers and time,
// each node's layers, state, steps, step time and failures.
std::string GridViewJson(const grid::GridHead& head, int head_layers);

}  // namespace trellis::cli
