// trellis bench grammar: what constrained decoding costs per step (bench_grammar.cc).
// For each vocabulary and schema: the schema's compile time, and the time to compute the
// token mask at every step of seeded random walks through valid documents: the first walk
// (positions computed as they are met) and a second (all cached), median and p99.
//
// Thread-safety: RunGrammarBench is called once from main().
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace trellis::cli {

struct GrammarBenchOptions {
  std::vector<std::string> vocabs;  // GGUF files with a tokenizer (a model or vocab-only)
  int steps = 200;                  // mask computations per walk
  int walks = 4;
  std::string csv;                  // append one row per (vocab, schema)
};

std::pair<CLI::App*, std::shared_ptr<GrammarBenchOptions>> AddGrammarBench(CLI::App& app);
int RunGrammarBench(const GrammarBenchOptions& o);

}  // namespace trellis::cli
