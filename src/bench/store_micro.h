// trellis bench store: micro-benchmarks of the prefix tensor store (see store_micro.cc).
#pragma once

#include "util/status.h"

#include <cstdint>
#include <string>

namespace trellis::bench {

struct StoreBenchOptions {
  bool micro = false;
  int blocks = 64;                 // blocks in the bulk get
  uint64_t block_bytes = 720896;   // 704 KiB: TinyLlama's 32-token KV block (22 layers, f16)
  int runs = 7;                    // timed gets per round (median)
  int rounds = 5;                  // store and ucx_perftest alternate this many times
  int servers = 4;                 // store processes in the lookup test
  int prompt_tokens = 8192;
  int lookups = 2000;
  bool no_perftest = false;
  std::string out = "results/store";
};

Status RunStoreBench(const StoreBenchOptions& o);

}  // namespace trellis::bench
