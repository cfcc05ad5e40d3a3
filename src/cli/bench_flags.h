// The flags of `trellis bench grammar` and `bench roofline`: each adds its subcommand and
// returns the options it fills (the drivers: bench/grammar.h, bench/roofline.h).
#pragma once

#include <memory>
#include <utility>

#include <CLI/CLI.hpp>

#include "bench/grammar.h"
#include "bench/roofline.h"

namespace trellis::cli {

std::pair<CLI::App*, std::shared_ptr<bench::GrammarBenchOptions>> AddGrammarBench(CLI::App& app);
std::pair<CLI::App*, std::shared_ptr<bench::RooflineBenchOptions>> AddRooflineBench(CLI::App& app);

}  // namespace trellis::cli
