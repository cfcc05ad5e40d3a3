#include "util/log.h"

#include <atomic>
#include <string>

namespace trellis {
namespace {
std::atomic<LogLevel> g_level{LogLevel::kWarn};
}

void SetLogLevel(LogLevel level) { g_level.store(level, std::memory_order_relaxed); }
LogLevel GetLogLevel() { return g_level.load(std::memory_order_relaxed); }

void LogLine(LogLevel level, const std::string& line) {
  static const char* kNames[] = {"debug", "info", "warn", "error", "off"};
  std::fprintf(stderr, "[%s] %s\n", kNames[static_cast<int>(level)], line.c_str());
}

}  // namespace trellis
