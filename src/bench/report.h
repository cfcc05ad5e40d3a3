// What every benchmark's output starts with: when, which commit, on what CPU and ISA
// path, with how many cores, by which command. Figures without these are not comparable
// across sessions (the machines change between them).
#pragma once

#include "util/status.h"

#include <string>
#include <vector>

namespace trellis::bench {

// "# key: value" lines: date (UTC), commit (of the source tree this binary was built
// from), cpu (model name, family, model), isa (the kernel path in use, with `isa_note`
// after it when not empty), cores, command (this process's argv).
std::string RunHeader(const std::string& isa_note = "");

// Runs a shell command and returns what it printed on stdout ("" when it cannot run).
std::string Capture(const std::string& cmd);

double Mean(const std::vector<double>& v);    // 0 for none
double Median(std::vector<double> v);
// A benchmark that could not run (or whose requests failed): the CLI prints the message.
inline Status Failure(std::string message) { return Status(StatusCode::kFailedPrecondition, std::move(message)); }         // 0 for none
// The q-quantile (0 <= q <= 1) by nearest rank: the sorted v[floor(q * n)], clamped to the
// last (a p99 of latencies is one of the values measured); 0 for none.
double Quantile(std::vector<double> v, double q);
// The q-quantile interpolated linearly between closest ranks (numpy's default); 0 for none.
double QuantileLinear(std::vector<double> v, double q);

// A line plot by gnuplot: OUT/NAME.png from the data file `data` (one gnuplot data
// block per series, "x y" lines), its script kept as OUT/NAME.gp. `who` names the
// benchmark in the message printed when gnuplot fails.
void Plot(const std::string& who, const std::string& out, const std::string& name, const std::string& title,
          const std::string& xlabel, const std::string& ylabel, const std::string& data,
          const std::vector<std::string>& series, bool logscale);

}  // namespace trellis::bench
