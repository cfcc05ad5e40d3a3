// The grid evaluation's pipeline model (grid_eval.cc's file comment gives its formulas):
// the model's geometry read from its GGUF, the parts' times measured in this process (one
// layer at r decode rows and per prefill chunk, alone and with the other core busy; the
// output head), and the figures they predict for a split of the layers over processes.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "bench/grid_eval.h"
#include "util/status.h"

namespace trellis::bench::grid_model {

inline constexpr int kBlock = 32;  // KV block tokens of every configuration

struct Geometry {
  int n_layer = 0, n_embd = 0, n_vocab = 0, n_ctx = 0;
  int eos = -1;
  double layer_bytes = 0;   // one layer's weights
  double output_bytes = 0;  // output matrix and norm
  double embd_bytes = 0;
  double kv_layer_block_bytes = 0;  // one layer's slice of one KV block
};
Result<Geometry> ReadGeometry(const std::string& path);
// Layers per process for n processes (the head first), each streaming about as many
// weight bytes per step.
std::vector<int> Split(const Geometry& g, int n);

struct Parts {
  // Alone: nothing else runs. Busy: the same work runs on another core at the same time,
  // as the stages of a pipeline on one machine do (they share memory bandwidth and caches).
  std::map<int, double> layer, layer_busy;    // decode rows -> seconds per layer
  std::map<int, double> output, output_busy;  // rows -> seconds of the output head
  double prefill_layer_chunk = 0, prefill_layer_chunk_busy = 0;  // one --chunk chunk, averaged over the prompt
  double prefill_layer_whole = 0;  // the whole L-token prompt in one step, alone
};
// Every layer, not a few: a few layers' weights would partly stay in the CPU's caches
// between runs, which the real runs' whole model never does.
Result<Parts> MeasureParts(const GridEvalOptions& o, const Geometry& g, const std::vector<int>& rows);

struct Prediction {
  double decode1 = 0, decode_s = 0, ttft = 0;
};
// layers[0] is the head's; cores bounds how many stages run at once; `shared` says the
// stages share this machine (their parts' busy times apply).
Prediction Predict(const GridEvalOptions& o, const Geometry& g, const Parts& parts, const std::vector<int>& layers,
                   double rtt, double bw, double cores, bool shared);

}  // namespace trellis::bench::grid_model
