// trellis bench prefix: RadixAttention benchmarks (see bench_prefix.cc).
#pragma once

#include <string>

namespace trellis::cli {

struct PrefixBenchOptions {
  std::string model;
  std::string out_dir = "results/prefix";
  int L = 512, D = 64, N = 8, block_size = 32, reps = 3, threads = 0;
  bool quick = false, json = false;
  std::string only;  // "throughput", "ttft" or "blocksize"; empty = all three
};

int RunPrefixBench(const PrefixBenchOptions& o);

}  // namespace trellis::cli
