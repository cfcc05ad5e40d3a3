// TRELLIS_UNROLL: fully unroll the next fixed-trip-count loop (up to 16 trips). Kernel
// loops over register arrays (accumulators per token, group or query) need it: GCC -O2
// leaves some of them rolled, which keeps the array addressable, in memory, and turns
// every update in the hot loop into a store.
#pragma once

#define TRELLIS_UNROLL _Pragma("GCC unroll 16")
