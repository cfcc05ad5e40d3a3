// trellis bench grammar: what constrained decoding costs per step (grammar.cc).
// For each vocabulary and schema: the schema's compile time, and the time to compute the
// token mask at every step of seeded random walks through valid documents: the first walk
// (positions computed as they are met) and a second (all cached), median and p99.
// With --model: constrained against free decode through the server, at 1 and 8 sessions,
// for trellis serve and (with --llama-server) llama-server on the same model, prompt and
// schemas, in alternating rounds (grammar.cc says how it is timed).
//
// Thread-safety: RunGrammarBench is called once from main().
#pragma once

#include "util/status.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>


namespace trellis::bench {

struct GrammarBenchOptions {
  std::vector<std::string> vocabs;  // GGUF files with a tokenizer (a model or vocab-only)
  int steps = 200;                  // mask computations per walk
  int walks = 4;
  std::string csv;                  // append one row per (vocab, schema)
  // Schema files (JSON Schema Test Suite layout: arrays of {"schema": ...} groups, or one
  // schema per file) whose compile time to the first mask is measured on each vocabulary.
  std::vector<std::string> compile_schemas;
  // Decode through the servers (--model).
  std::string model;                // GGUF model; empty = the mask part only
  std::string llama_server;         // llama-server binary; empty = trellis only
  std::vector<int> sessions = {1, 8};
  int tokens = 64, rounds = 3, threads = 2, timeout_s = 600;
  std::string out_dir = "results/grammar";
};

Status RunGrammarBench(const GrammarBenchOptions& o);

}  // namespace trellis::bench
