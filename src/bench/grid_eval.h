// trellis bench grid: the grid against one process (see grid_eval.cc for what it runs,
// docs/BENCHMARKS.md for the figures).
#pragma once

#include <string>
#include <vector>

namespace trellis::bench {

struct GridEvalOptions {
  std::string trellis;  // the trellis executable the processes run
  std::string model;    // GGUF (default: the TinyLlama shape)
  std::string out = "results/grid";
  std::vector<int> nodes = {1, 2, 3};  // grid sizes (1: one process, one thread)
  std::string rate = "10gbit";         // tc tbf rate of every node's link in namespaces
  bool netns = true;                   // the runs on network namespaces (needs root)
  bool loopback = true;                // the runs on plain loopback
  int sessions = 8;                    // the aggregate decode's concurrent sessions
  int decode_tokens = 128;
  int prompt = 512;                    // TTFT prompt length L
  double phi = 0.9;                    // shared-prefix share of the TTFT(phi) check
  int reps = 3;                        // alternating repetitions (medians reported)
  int node_threads = 1;                // threads of each grid process
  int baseline_threads = 2;            // the one-process baseline's threads
  int depth = 2;                       // --grid-depth
  int chunk = 64;                      // --grid-chunk
  int predict_nodes = 8;               // the pipeline model's extra prediction
  double predict_gbit = 10;            // ... on a link of this many Gbit/s
  bool quick = false;                  // the tiny model, fewer tokens (CI)
  bool store = true;                   // also TTFT from a prefix store on a new head
  bool plots = true;
};

// Runs everything, prints the tables, writes OUT/grid_eval.csv (one row per measurement),
// OUT/grid_eval_summary.csv and PNGs. Returns a process exit code.
int RunGridEval(const GridEvalOptions& o);

}  // namespace trellis::bench
