// trellis bench prefix: RadixAttention benchmarks (see prefix.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "util/status.h"

namespace trellis::bench {

struct PrefixBenchOptions {
  std::string model;
  std::string out_dir = "results/prefix";
  int L = 512, D = 64, N = 8, block_size = 32, reps = 3, threads = 0;
  bool quick = false, json = false;
  std::string only;  // "throughput", "ttft" or "blocksize"; empty = all three
  // The process's heap allocations so far (the trellis binary counts them: cli/alloc_counter.h);
  // null: allocations are not reported (0).
  std::function<int64_t()> heap_allocations;
};

Status RunPrefixBench(const PrefixBenchOptions& o);

}  // namespace trellis::bench
