// Subcommands of the `trellis` binary. Each registers its options on a CLI11 app and
// returns a runner; main() parses and runs the chosen one. Runners return the process
// exit code and print errors as `trellis: <what went wrong>` on stderr.
#pragma once

#include <csignal>
#include <functional>
#include <string>
#include <utility>

#include "util/status.h"

#include <CLI/CLI.hpp>

namespace trellis::cli {

using Runner = std::function<int()>;

Runner AddRunCommand(CLI::App& app);
Runner AddTokenizeCommand(CLI::App& app);
Runner AddGgufInfoCommand(CLI::App& app);
Runner AddGenModelCommand(CLI::App& app);
Runner AddBenchCommand(CLI::App& app);
Runner AddServeCommand(CLI::App& app);
Runner AddChatCommand(CLI::App& app);
Runner AddStoreCommand(CLI::App& app);
Runner AddNodeCommand(CLI::App& app);

// "HOST:PORT" -> (host, port); errors name the flag.
Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& s, const std::string& flag);

// For long-running commands: ignores SIGPIPE (a closed peer socket must not kill the
// process) and blocks SIGINT and SIGTERM in the calling thread, so every thread started
// after inherits the mask and one thread takes them with sigwait on the returned set.
// Call before starting any thread.
sigset_t BlockStopSignals();

// -t: `requested` when > 0; 0 picks the default, the physical cores this process may use
// (affinity mask and cgroup quota respected, util/cpus.h). `how`, if given, says how the
// default was chosen ("" when -t was given); ThreadsText makes the banner's words:
// "8 threads (default: 8 physical cores of 16 CPUs allowed)".
int ResolveThreads(int requested, std::string* how = nullptr);
std::string ThreadsText(int threads, const std::string& how);
inline constexpr const char* kThreadsHelp = "compute threads (default: the physical cores this process may use)";

// Prints "trellis: <message>" to stderr and returns 1.
int Fail(const std::string& message);

// Default vocab for gen-model: the LLaMA SPM vocab shipped in the repository.
std::string DefaultVocabPath();

}  // namespace trellis::cli
