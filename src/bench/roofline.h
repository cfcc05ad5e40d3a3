// trellis bench roofline: this machine's limits for the benchmarks of docs/BENCHMARKS.md
// (see roofline.cc and docs/ROOFLINE.md). Measures DRAM and L2 read bandwidth and
// the int8 / f32 / bf16 arithmetic peaks for 1 thread and for --threads threads, then
// prints the decode and prefill ceilings they imply for the TinyLlama shape.
//
// Thread-safety: RunRooflineBench is called once from main(); it starts its own threads
// and joins them before returning.
#pragma once

#include "util/status.h"

#include <memory>
#include <string>
#include <utility>


namespace trellis::bench {

struct RooflineBenchOptions {
  int threads = 2;
  bool json = false;   // one JSON object per line instead of the tables
  bool quick = false;  // small buffers, 3 repetitions, short loops: ~1 s (a smoke test)
  std::string csv;     // append one row per figure to this file
};

// Registers `roofline` under `bench`; the caller runs RunRooflineBench when it was parsed.

Status RunRooflineBench(const RooflineBenchOptions& o);

}  // namespace trellis::bench
