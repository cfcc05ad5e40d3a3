// Process-wide count of heap allocations (global operator new), for benchmarks that
// report allocations per operation. Defined by replacing operator new in the trellis
// binary only; one relaxed atomic increment per allocation.
#pragma once

#include <cstdint>

namespace trellis::cli {
int64_t HeapAllocations();
}  // namespace trellis::cli
