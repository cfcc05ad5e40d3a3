// What the system says about its memory.
#pragma once

#include <cstdint>

namespace trellis {

// MemAvailable from /proc/meminfo in bytes, or -1 if unknown.
int64_t MemAvailableBytes();

}  // namespace trellis
