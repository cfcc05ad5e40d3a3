// Minimal structured logging to stderr: `component: key=value ...` lines.
//
// Logging happens where an error is handled, never per token. The level is set once
// at start-up (SetLogLevel) before threads start; after that it is read-only.
#pragma once

#include <fmt/core.h>

#include <cstdio>

namespace trellis {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void LogLine(LogLevel level, const std::string& line);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < GetLogLevel()) return;
  LogLine(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace trellis

#define TRELLIS_LOG_DEBUG(...) ::trellis::Log(::trellis::LogLevel::kDebug, __VA_ARGS__)
#define TRELLIS_LOG_INFO(...) ::trellis::Log(::trellis::LogLevel::kInfo, __VA_ARGS__)
#define TRELLIS_LOG_WARN(...) ::trellis::Log(::trellis::LogLevel::kWarn, __VA_ARGS__)
#define TRELLIS_LOG_ERROR(...) ::trellis::Log(::trellis::LogLevel::kError, __VA_ARGS__)
