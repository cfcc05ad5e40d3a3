// trellis bench serve: a load generator for any OpenAI-compatible server (see
// serve.cc and docs/BENCHMARKS.md). C clients, each sending R streamed requests
// one after another, all sharing one system prompt; reports requests/s, TTFT
// percentiles, inter-token latency and the share of prompt tokens served from cache.
//
// Thread-safety: RunServeBench is called once from main(); it starts its own client
// threads and joins them before returning.
#pragma once

#include "util/status.h"

#include <string>

namespace trellis::bench {

struct ServeBenchOptions {
  std::string url;        // base URL of the server; empty = start `trellis serve -m model`
  std::string model;      // GGUF for the server started here
  std::string model_name; // "model" field of each request (empty = omitted)
  std::string label;      // name in the table and CSV (default: "trellis" or the URL)
  std::string out_dir = "results/serve";
  std::string api_key;
  std::string serve_args;  // extra arguments for the started server, space-separated
  int clients = 8, requests = 4, system_tokens = 400, max_tokens = 32, warmup = 1, threads = 2;
  int timeout_s = 600;
  bool completions = false, ban_bytes = false, json = false, keep_alive = false;
};

Status RunServeBench(const ServeBenchOptions& o);

}  // namespace trellis::bench
