// What every benchmark's output starts with: when, which commit, on what CPU and ISA
// path, with how many cores, by which command. Figures without these are not comparable
// across sessions (the machines change between them).
#pragma once

#include <string>

namespace trellis::bench {

// "# key: value" lines: date (UTC), commit (of the source tree this binary was built
// from), cpu (model name, family, model), isa (the kernel path in use, with `isa_note`
// after it when not empty), cores, command (this process's argv).
std::string RunHeader(const std::string& isa_note = "");

// Runs a shell command and returns what it printed on stdout ("" when it cannot run).
std::string Capture(const std::string& cmd);

}  // namespace trellis::bench
