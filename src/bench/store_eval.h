// trellis bench store: the PTStore evaluation in miniature (see store_eval.cc for what it
// runs, docs/BENCHMARKS.md for the figures).
#pragma once

#include <string>
#include <vector>

namespace trellis::bench {

struct StoreEvalOptions {
  std::string trellis;  // the trellis executable the nodes run
  std::string model;    // GGUF every node serves
  std::string out = "results/store-eval";
  std::vector<int> contexts = {1024, 2048, 4096, 8192};  // prompt tokens (passage + question)
  std::vector<int> nodes = {1, 2, 3, 4};                  // node counts of the scaling sweep
  std::vector<std::string> traces = {"squad", "wikiqa"};
  std::string rate = "10gbit";  // tc tbf rate of every node's link
  bool loopback = false;        // no namespaces: nodes on 127.0.0.1 (ports apart), links not shaped
  int threads = 2;              // compute threads per node
  int kv_contexts = 2;          // each node's KV pool holds this many full contexts
  std::string kv_type = "f16";  // every node's K and V cache type (serve -ctk / -ctv)
  int question_tokens = 24;
  int answer_tokens = 8;
  int single_flight_reps = 3;   // new contexts sent to every node at once
  int phi_rounds = 3;           // alternating rounds of the phi 0.9 comparison
  bool quick = false;           // fewer passages and questions (CI)
  bool plots = true;            // PNGs by gnuplot, when it is installed
};

// Runs everything, prints the tables, writes OUT/store_eval.csv (one row per request),
// OUT/store_eval_summary.csv, OUT/store_eval_mrc.csv and PNGs. Returns a process exit code.
int RunStoreEval(const StoreEvalOptions& o);

}  // namespace trellis::bench
