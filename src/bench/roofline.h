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

// This machine's limits at `threads` threads, measured now (the same loops as the bench;
// quick: ~1 s, else ~3 s), per second: the int8 dot and f32 FMA peaks in ops, the DRAM read
// bandwidth in bytes (the better of the load widths). 0 where the CPU has no such loop.
struct MachineLimits {
  double int8_ops = 0, f32_flops = 0, dram_bytes = 0;
  double clock_hz = 0;  // one core's clock while the peaks ran (16 dependent adds per loop)
};
Result<MachineLimits> MeasureLimits(int threads, bool quick);

}  // namespace trellis::bench
