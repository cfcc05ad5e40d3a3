#include "cli/bench_grammar.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "cli/commands.h"
#include "engine/constraint.h"
#include "grammar/json_schema.h"
#include "kernels/cpu_features.h"
#include "model/gguf.h"

namespace trellis::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Schema {
  const char* name;
  const char* json;  // "" : json_object
};

const Schema kSchemas[] = {
    {"json_object", ""},
    {"person", R"~({"type":"object","properties":{"name":{"type":"string","maxLength":20},"age":{"type":"integer"},
      "email":{"type":"string","format":"email"}},"required":["name","age"],"additionalProperties":false})~"},
    {"order", R"~({"type":"object","properties":{"items":{"type":"array","minItems":1,"maxItems":4,"items":{"type":"object",
      "properties":{"sku":{"type":"string","format":"uuid"},"qty":{"type":"integer"},"kind":{"enum":["book","tool","food"]}},
      "required":["sku","qty","kind"],"additionalProperties":false}}},"required":["items"],"additionalProperties":false})~"},
    {"tree", R"~({"$defs":{"node":{"type":"object","properties":{"v":{"type":"number"},"kids":{"type":"array","maxItems":2,
      "items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})~"},
};

}  // namespace

std::pair<CLI::App*, std::shared_ptr<GrammarBenchOptions>> AddGrammarBench(CLI::App& app) {
  CLI::App* g = app.add_subcommand("grammar", "constrained decoding: schema compile time and per-step token-mask time, "
                                              "cold and cached, per vocabulary");
  auto o = std::make_shared<GrammarBenchOptions>();
  g->add_option("--vocab", o->vocabs, "GGUF file(s) with a tokenizer (models or vocab-only files)")->required();
  g->add_option("--steps", o->steps, "mask computations per walk")->capture_default_str();
  g->add_option("--walks", o->walks, "walks per schema")->capture_default_str();
  g->add_option("--csv", o->csv, "append a CSV row per (vocabulary, schema) to this file");
  return {g, o};
}

int RunGrammarBench(const GrammarBenchOptions& o) {
  fmt::print("trellis bench grammar  (1 thread; kernels {})\n", KernelPathName());
  fmt::print("{:<28} {:>7} {:<12} {:>11} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "vocabulary", "tokens", "schema",
             "compile ms", "cold p50", "cold p99", "warm p50", "warm p99", "positions");
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv, std::ios::app);
    if (!csv) return Fail("cannot write " + o.csv);
  }
  for (const std::string& path : o.vocabs) {
    auto f = GgufFile::Open(path);
    if (!f.ok()) return Fail(f.status().ToString());
    auto tok = Tokenizer::FromGguf(*f);
    if (!tok.ok()) return Fail(tok.status().ToString());
    auto vocab = MakeTokenVocabulary(**tok);
    const std::string vname = path.substr(path.find_last_of('/') + 1);
    for (const Schema& s : kSchemas) {
      std::vector<double> compile;
      grammar::Grammar g;
      for (int r = 0; r < 20; ++r) {
        const auto t0 = Clock::now();
        auto c = s.json[0] ? grammar::CompileJsonSchema(s.json) : grammar::ParseGbnf(grammar::JsonObjectGbnf());
        compile.push_back(Ms(Clock::now() - t0));
        if (!c.ok()) return Fail(c.status().message());
        g = std::move(*c);
      }
      auto compiled = std::make_shared<grammar::CompiledGrammar>(g, vocab);
      grammar::TokenMask mask(vocab->n_vocab());
      std::vector<double> cold, warm;
      for (int pass = 0; pass < 2; ++pass) {
        std::mt19937_64 rng(42);  // the same walks both passes: the second finds every position cached
        for (int w = 0; w < o.walks; ++w) {
          auto m = grammar::GrammarMatcher::Make(compiled);
          if (!m.ok()) return Fail(m.status().message());
          std::vector<int32_t> allowed;
          for (int step = 0; step < o.steps && !(*m)->ended(); ++step) {
            const auto t0 = Clock::now();
            if (Status st = (*m)->FillMask(mask); !st.ok()) return Fail(st.message());
            (pass == 0 ? cold : warm).push_back(Ms(Clock::now() - t0));
            allowed.clear();
            for (int32_t id = 0; id < vocab->n_vocab(); ++id) {
              if (mask.Test(id)) allowed.push_back(id);
            }
            if (allowed.empty()) return Fail("bench grammar: a dead end (a bug)");
            // Walk on (end tokens only when nothing else is allowed, so documents grow).
            int32_t pick = allowed[rng() % allowed.size()];
            for (int tries = 0; tries < 8 && vocab->is_eog(pick) && allowed.size() > 1; ++tries) pick = allowed[rng() % allowed.size()];
            if (Status st = (*m)->Accept(pick); !st.ok()) return Fail(st.message());
          }
        }
      }
      const double c50 = Quantile(compile, 0.5);
      fmt::print("{:<28} {:>7} {:<12} {:>11.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>9}\n", vname, vocab->n_vocab(),
                 s.name, c50, Quantile(cold, 0.5), Quantile(cold, 0.99), Quantile(warm, 0.5), Quantile(warm, 0.99),
                 compiled->cached_positions());
      if (csv) {
        csv << fmt::format("grammar,{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{}\n", KernelPathName(), vname,
                           vocab->n_vocab(), s.name, c50, Quantile(cold, 0.5), Quantile(cold, 0.99), Quantile(warm, 0.5),
                           Quantile(warm, 0.99), compiled->cached_positions());
      }
    }
  }
  fmt::print("(ms per step; cold = positions computed as met, warm = all cached; compile = schema -> grammar, median of 20)\n");
  return 0;
}

}  // namespace trellis::cli
