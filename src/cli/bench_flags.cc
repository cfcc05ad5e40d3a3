// The flags of `trellis bench grammar` and `bench roofline` (the drivers: src/bench).
#include "cli/bench_flags.h"

#include "cli/commands.h"

namespace trellis::cli {

using bench::GrammarBenchOptions;
using bench::RooflineBenchOptions;

std::pair<CLI::App*, std::shared_ptr<GrammarBenchOptions>> AddGrammarBench(CLI::App& app) {
  CLI::App* g = app.add_subcommand("grammar", "constrained decoding: schema compile time and per-step token-mask time, "
                                              "cold and cached, per vocabulary");
  auto o = std::make_shared<GrammarBenchOptions>();
  g->add_option("--vocab", o->vocabs, "GGUF file(s) with a tokenizer (models or vocab-only files): mask times");
  g->add_option("--steps", o->steps, "mask computations per walk")->capture_default_str();
  g->add_option("--walks", o->walks, "walks per schema")->capture_default_str();
  g->add_option("--csv", o->csv, "append a CSV row per (vocabulary, schema) to this file");
  g->add_option("--compile-schemas", o->compile_schemas,
                "schema files or folders (JSON Schema Test Suite layout, e.g. "
                "/usr/share/json-schema-test-suite/tests/draft7): time from schema text to the first token mask, "
                "p50 / p99 / max over every schema the converter takes, on each --vocab");
  g->add_option("-m,--model", o->model, "GGUF model: constrained vs free decode through trellis serve");
  g->add_option("--llama-server", o->llama_server, "llama-server binary: the same decode through it, side by side");
  g->add_option("--sessions", o->sessions, "concurrent requests per batch")->capture_default_str();
  g->add_option("--tokens", o->tokens, "max_tokens per request")->capture_default_str();
  g->add_option("--rounds", o->rounds, "rounds (alternating the order of the modes)")->capture_default_str();
  g->add_option("-t,--threads", o->threads, "threads of each server")->capture_default_str();
  g->add_option("-o,--out", o->out_dir, "folder for grammar-decode.csv and the servers' logs")->capture_default_str();
  return {g, o};
}

std::pair<CLI::App*, std::shared_ptr<RooflineBenchOptions>> AddRooflineBench(CLI::App& app) {
  CLI::App* r = app.add_subcommand("roofline", "this machine's limits: DRAM and L2 read bandwidth, int8/f32/bf16 "
                                               "peaks, and the decode/prefill ceilings they imply (TinyLlama shape)");
  auto ro = std::make_shared<RooflineBenchOptions>();
  r->add_option("-t,--threads", ro->threads, "threads (figures for 1 and for this many)")->capture_default_str();
  r->add_flag("--quick", ro->quick, "small buffers, 3 repetitions: ~1 s (not DRAM-sized, a smoke test)");
  r->add_flag("--json", ro->json, "print one JSON object per line");
  r->add_option("--csv", ro->csv, "append a CSV row per figure to this file");
  return {r, ro};
}

}  // namespace trellis::cli
