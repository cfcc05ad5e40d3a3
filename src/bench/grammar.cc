#include "bench/grammar.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/http.h"
#include "bench/report.h"
#include "engine/constraint.h"
#include "grammar/json_schema.h"
#include "kernels/cpu_features.h"
#include "model/gguf.h"

namespace trellis::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

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

// --- decode through the servers -------------------------------------------------------
//
// Each request is a streamed /v1/completions with the same prompt text for both servers
// (so the same prompt tokens), max_tokens N, temperature 1 with a per-request seed, and
// logit_bias banning the tokens whose bytes are not whole UTF-8 and the control tokens
// other than the end tokens (with random weights llama-server answers HTTP 500 on broken
// UTF-8; the end token must stay, it ends a constrained answer). "free" requests also send ignore_eos, so they run to N
// tokens; constrained ones send llama.cpp's `json_schema` field (both servers take it)
// and end when the document is complete. A random model under a grammar decodes exactly
// the steps a real one would: the mask is computed from the grammar state, whatever the
// logits are.
//
// Timed: S requests sent at once (S = sessions); for each, the arrival time of every
// streamed chunk with text. Decode tok/s of the batch = the chunks that arrived while
// every request was decoding (after the last request's first chunk, up to the first
// request's last) / that window's length: prefill is left out, and a request that ends
// early (its document complete) does not count the steps the others then run in a smaller
// batch. Tokens per request: usage.completion_tokens (trellis), timings.predicted_n
// (llama-server), else the chunks counted. Rounds alternate the order of the modes; the
// median over rounds is reported, and constrained / free within one server and one round.

// A structured schema (short strings, integers, enums: a mask that changes every few
// tokens) and a loose one (free strings: long runs inside one string).
const Schema kDecodeSchemas[] = {
    {"records", R"~({"type":"array","minItems":3,"items":{"type":"object","properties":{"id":{"type":"integer"},
      "kind":{"enum":["book","tool","food"]},"ok":{"type":"boolean"},"name":{"type":"string","maxLength":8}},
      "required":["id","kind","ok","name"],"additionalProperties":false}})~"},
    {"notes", R"~({"type":"object","properties":{"title":{"type":"string"},"notes":{"type":"array",
      "items":{"type":"string"}}},"required":["title","notes"],"additionalProperties":false})~"},
};

struct Batch {
  double tok_s = 0, tokens = 0;  // decode rate of the batch; mean tokens per request
  double mask_ms = -1;           // trellis: scheduler time per token mask (its /metrics), else -1
  std::string error;
};

// The token vocabulary (the grammar's view of it) of a GGUF file's tokenizer.
Result<std::shared_ptr<const grammar::TokenVocabulary>> LoadVocabulary(const std::string& path) {
  TRELLIS_ASSIGN_OR_RETURN(auto f, GgufFile::Open(path));
  TRELLIS_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromGguf(f));
  return MakeTokenVocabulary(*tok);
}

// The logit_bias above, from the model's vocabulary.
Result<nlohmann::json> BanList(const std::string& model) {
  TRELLIS_ASSIGN_OR_RETURN(auto vocab, LoadVocabulary(model));
  nlohmann::json ban = nlohmann::json::array();
  for (int32_t id = 0; id < vocab->n_vocab(); ++id) {
    if (vocab->is_eog(id)) continue;
    std::vector<uint32_t> cps;
    const std::string_view p = vocab->piece(id);
    if (p.empty() || !grammar::DecodeUtf8(p, cps)) ban.push_back(nlohmann::json::array({id, false}));
  }
  return ban;
}

Batch RunBatch(const bench::Endpoint& ep, const GrammarBenchOptions& o, const std::string& prompt, const char* schema,
               int sessions, uint64_t seed, const nlohmann::json& ban) {
  using nlohmann::json;
  auto metrics = bench::MakeHttpClient(ep, o.timeout_s);
  const double masks0 = bench::ScrapeMetric(*metrics, ep, "trellis_grammar_masks_total");
  const double secs0 = bench::ScrapeMetric(*metrics, ep, "trellis_grammar_mask_seconds_total");
  const double gen0 = bench::ScrapeMetric(*metrics, ep, "trellis_generated_tokens_total");
  std::vector<double> first(sessions, -1), last(sessions, -1);
  std::vector<std::vector<double>> times(sessions);  // arrival of each chunk with text
  std::vector<int64_t> tokens(sessions, 0);
  std::vector<std::string> errors(sessions);
  std::latch start(sessions + 1);
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int i = 0; i < sessions; ++i) {
    threads.emplace_back([&, i] {
      auto cli = bench::MakeHttpClient(ep, o.timeout_s);
      json b = {{"prompt", prompt}, {"max_tokens", o.tokens}, {"temperature", 1.0}, {"seed", seed * 100 + i},
                {"stream", true}, {"stream_options", {{"include_usage", true}}}};
      b["logit_bias"] = ban;
      if (schema) {
        b["json_schema"] = json::parse(schema);
      } else {
        b["ignore_eos"] = true;
      }
      int64_t chunks = 0, usage = -1, predicted = -1;
      start.arrive_and_wait();
      const bench::SseOutcome out = bench::PostSse(*cli, ep.prefix + "/v1/completions", b.dump(), [&](const json& ev, double) {
        const double t = std::chrono::duration<double>(Clock::now() - t0).count();
        if (ev.contains("error")) {
          errors[i] = ev["error"].dump().substr(0, 200);
          return false;
        }
        if (ev.contains("usage") && ev["usage"].is_object()) usage = ev["usage"].value("completion_tokens", int64_t{-1});
        if (ev.contains("timings") && ev["timings"].is_object()) predicted = ev["timings"].value("predicted_n", int64_t{-1});
        if (ev.contains("choices") && ev["choices"].is_array() && !ev["choices"].empty() &&
            ev["choices"][0].contains("text") && ev["choices"][0]["text"].is_string() &&
            !ev["choices"][0]["text"].get_ref<const std::string&>().empty()) {
          ++chunks;
          if (first[i] < 0) first[i] = t;
          last[i] = t;
          times[i].push_back(t);
        }
        return true;
      });
      if (errors[i].empty() && !out.error.empty()) errors[i] = out.error;
      tokens[i] = usage > 0 ? usage : predicted > 0 ? predicted : chunks;
    });
  }
  start.arrive_and_wait();
  for (auto& t : threads) t.join();
  Batch r;
  // The window in which every request was decoding: from the last first chunk to the
  // first last chunk. Chunks in it, over its length: S sessions' decode rate throughout.
  double begin = 0, end = 1e300;
  for (int i = 0; i < sessions; ++i) {
    if (!errors[i].empty()) {
      r.error = errors[i];
      return r;
    }
    if (times[i].size() < 2) continue;  // fewer than two chunks: no decode interval
    begin = std::max(begin, first[i]);
    end = std::min(end, last[i]);
    r.tokens += static_cast<double>(tokens[i]) / sessions;
  }
  int64_t in_window = 0;
  for (int i = 0; i < sessions; ++i) {
    for (double t : times[i]) in_window += (t > begin && t <= end) ? 1 : 0;
  }
  if (end >= 1e300 || end <= begin || in_window == 0) {
    r.error = "no window in which every request was decoding";
    return r;
  }
  r.tok_s = static_cast<double>(in_window) / (end - begin);
  if (gen0 >= 0) {
    // /metrics is a snapshot the engine refreshes: wait until it holds this batch's tokens
    // (then the next batch starts from a snapshot that holds them too).
    double batch_tokens = 0;
    for (int64_t t : tokens) batch_tokens += static_cast<double>(t);
    for (int tries = 0; tries < 100; ++tries) {
      if (bench::ScrapeMetric(*metrics, ep, "trellis_generated_tokens_total") >= gen0 + batch_tokens) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (masks0 >= 0 && secs0 >= 0 && schema) {
    const double masks = bench::ScrapeMetric(*metrics, ep, "trellis_grammar_masks_total") - masks0;
    const double secs = bench::ScrapeMetric(*metrics, ep, "trellis_grammar_mask_seconds_total") - secs0;
    if (masks > 0) r.mask_ms = 1e3 * secs / masks;
  }
  return r;
}

Status RunDecodeBench(const GrammarBenchOptions& o) {
  ::mkdir(o.out_dir.c_str(), 0755);
  struct Server {
    std::string label;
    bench::ChildProcess proc;
    bench::Endpoint ep;
    bool llama = false;
  };
  std::vector<std::unique_ptr<Server>> servers;
  const int max_s = *std::max_element(o.sessions.begin(), o.sessions.end());
  {
    auto s = std::make_unique<Server>();
    s->label = "trellis";
    auto addr = s->proc.Start("/proc/self/exe",
                              {"trellis", "serve", "-m", o.model, "--host", "127.0.0.1", "--port", "0", "--threads",
                               std::to_string(o.threads), "--ctx-size", "1024"},
                              o.out_dir + "/trellis-serve.log", "trellis serve", o.timeout_s);
    if (!addr.ok()) return Failure(addr.status().ToString());
    s->ep = bench::ParseUrl(*addr);
    servers.push_back(std::move(s));
  }
  if (!o.llama_server.empty()) {
    auto s = std::make_unique<Server>();
    s->label = "llama-server";
    s->llama = true;
    auto addr = s->proc.Start(o.llama_server,
                              {o.llama_server, "-m", o.model, "-t", std::to_string(o.threads), "-c",
                               std::to_string(1024 * max_s), "-np", std::to_string(max_s), "--host", "127.0.0.1",
                               "--port", "0", "--no-webui"},
                              o.out_dir + "/llama-server.log", "llama-server", o.timeout_s);
    if (!addr.ok()) return Failure(addr.status().ToString());
    s->ep = bench::ParseUrl(*addr);
    servers.push_back(std::move(s));
  }
  const std::string prompt = bench::BookshopText(40) + " Answer in JSON.";
  auto ban = BanList(o.model);
  if (!ban.ok()) return Failure(ban.status().ToString());
  std::fprintf(stderr, "bench grammar: %zu tokens banned (not whole UTF-8, or control)\n", ban->size());
  // modes: free, then each schema
  std::vector<std::pair<std::string, const char*>> modes = {{"free", nullptr}};
  for (const Schema& s : kDecodeSchemas) modes.emplace_back(s.name, s.json);
  // results[server][sessions][mode] over rounds
  std::map<std::tuple<std::string, int, std::string>, std::vector<Batch>> results;
  for (auto& srv : servers) {  // warm-up: weights paged in, threads spun up, schemas compiled once
    for (auto& [name, schema] : modes) {
      Batch b = RunBatch(srv->ep, o, prompt, schema, 1, 999, *ban);
      if (!b.error.empty()) return Failure(fmt::format("bench grammar: {} {} warm-up: {}", srv->label, name, b.error));
    }
  }
  for (int r = 0; r < o.rounds; ++r) {
    for (auto& srv : servers) {
      for (int s : o.sessions) {
        for (size_t k = 0; k < modes.size(); ++k) {
          auto& [name, schema] = modes[r % 2 ? modes.size() - 1 - k : k];  // alternate the order
          Batch b = RunBatch(srv->ep, o, prompt, schema, s, static_cast<uint64_t>(r + 1), *ban);
          if (!b.error.empty()) return Failure(fmt::format("bench grammar: {} {} x{}: {}", srv->label, name, s, b.error));
          std::fprintf(stderr, "bench grammar: round %d %s %s x%d: %.1f tok/s (%.0f tokens)\n", r + 1,
                       srv->label.c_str(), name.c_str(), s, b.tok_s, b.tokens);
          results[{srv->label, s, name}].push_back(b);
        }
      }
    }
  }
  const std::string path = o.out_dir + "/grammar-decode.csv";
  std::ofstream csv(path);
  csv << bench::RunHeader() << "# model: " << o.model << "\n# tokens: " << o.tokens << "\n# rounds: " << o.rounds << "\n";
  if (!o.llama_server.empty()) {
    csv << "# llama_server: " << o.llama_server << " ("
        << bench::Capture("'" + o.llama_server + "' --version 2>&1 | grep -m1 version | tr -d '\n'") << ")\n";
  }
  csv << "server,sessions,mode,decode_tok_s,tokens,ratio_to_free,mask_ms\n";
  fmt::print("\nconstrained vs free decode through the server ({} rounds, median; {} tokens max; kernels {})\n",
             o.rounds, o.tokens, KernelPathName());
  fmt::print("| server | sessions | mode | decode tok/s | tokens/request | / free | mask ms |\n"
             "|---|---:|---|---:|---:|---:|---:|\n");
  for (auto& srv : servers) {
    for (int s : o.sessions) {
      const auto& free = results[{srv->label, s, "free"}];
      for (auto& [name, schema] : modes) {
        const auto& v = results[{srv->label, s, name}];
        std::vector<double> rate, toks, ratio, mask;
        for (size_t i = 0; i < v.size(); ++i) {
          rate.push_back(v[i].tok_s);
          toks.push_back(v[i].tokens);
          ratio.push_back(v[i].tok_s / free[i].tok_s);  // within one round
          if (v[i].mask_ms >= 0) mask.push_back(v[i].mask_ms);
        }
        const double m = bench::Median(rate), t = bench::Median(toks), q = bench::Median(ratio);
        const std::string mk = mask.empty() ? "" : fmt::format("{:.4f}", bench::Median(mask));
        fmt::print("| {} | {} | {} | {:.1f} | {:.0f} | {:.3f} | {} |\n", srv->label, s, name, m, t, q, mk);
        csv << fmt::format("{},{},{},{:.2f},{:.1f},{:.4f},{}\n", srv->label, s, name, m, t, q, mk);
      }
    }
  }
  fmt::print("(decode tok/s: streamed chunks while every request of the batch was decoding / that window; "
             "/ free: the ratio within each round, median; mask ms: trellis's scheduler time per token mask, from its "
             "/metrics)\nwrote {}\n", path);
  return Status::Ok();
}

}  // namespace


// Every schema in the files (or folders of files) given: a file is one schema, or the
// JSON Schema Test Suite's array of {"description", "schema", "tests"} groups.
Result<std::vector<std::string>> LoadSchemas(const std::vector<std::string>& paths) {
  std::vector<std::string> files, out;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      for (const auto& e : std::filesystem::directory_iterator(p, ec)) {
        if (e.path().extension() == ".json") files.push_back(e.path().string());
      }
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) {
    std::ifstream in(f);
    if (!in) return IoError("cannot read " + f);
    auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return InvalidArgument(f + " is not JSON");
    if (j.is_array()) {
      for (const auto& group : j) {
        if (group.is_object() && group.contains("schema")) out.push_back(group["schema"].dump());
      }
    } else {
      out.push_back(j.dump());
    }
  }
  return out;
}

// Time from schema text to the first mask (what a request waits for before its first
// constrained step): convert, build the vocabulary-bound grammar, fill one mask.
Status RunCompileBench(const GrammarBenchOptions& o) {
  auto schemas = LoadSchemas(o.compile_schemas);
  if (!schemas.ok()) return Failure(schemas.status().ToString());
  fmt::print("{:<28} {:>7} {:>9} {:>8} {:>10} {:>10} {:>10}\n", "vocabulary", "tokens", "schemas", "refused",
             "p50 ms", "p99 ms", "max ms");
  for (const std::string& path : o.vocabs) {
    auto loaded = LoadVocabulary(path);
    if (!loaded.ok()) return Failure(loaded.status().ToString());
    const auto& vocab = *loaded;
    grammar::TokenMask mask(vocab->n_vocab());
    std::vector<double> ms;
    int refused = 0;
    for (const std::string& text : *schemas) {
      const auto t0 = Clock::now();
      auto g = grammar::CompileJsonSchema(text);
      if (!g.ok()) {
        ++refused;
        continue;
      }
      auto compiled = std::make_shared<grammar::CompiledGrammar>(*g, vocab);
      auto m = grammar::GrammarMatcher::Make(compiled);
      if (!m.ok()) return Failure(m.status().message());
      if (Status st = (*m)->FillMask(mask); !st.ok()) return Failure(st.message());
      ms.push_back(Ms(Clock::now() - t0));
    }
    const std::string vname = path.substr(path.find_last_of('/') + 1);
    fmt::print("{:<28} {:>7} {:>9} {:>8} {:>10.3f} {:>10.3f} {:>10.3f}\n", vname, vocab->n_vocab(), ms.size(), refused,
               bench::Quantile(ms, 0.5), bench::Quantile(ms, 0.99), ms.empty() ? 0.0 : *std::max_element(ms.begin(), ms.end()));
    if (!o.csv.empty()) {
      std::ofstream csv(o.csv, std::ios::app);
      if (csv.tellp() == 0) csv << "bench,kernels,vocab,n_vocab,schemas,refused,ms_p50,ms_p99,ms_max\n";
      csv << fmt::format("compile,\"{}\",{},{},{},{},{:.4f},{:.4f},{:.4f}\n", KernelPathName(), vname, vocab->n_vocab(),
                         ms.size(), refused, bench::Quantile(ms, 0.5), bench::Quantile(ms, 0.99),
                         ms.empty() ? 0.0 : *std::max_element(ms.begin(), ms.end()));
    }
  }
  fmt::print("(schema text -> grammar -> grammar bound to the vocabulary -> first mask, 1 thread; refused: keywords "
             "the converter lacks, a 400 at the server)\n");
  return Status::Ok();
}

Status RunGrammarBench(const GrammarBenchOptions& o) {
  if (o.vocabs.empty() && o.model.empty()) return Failure("bench grammar: give --vocab (mask times) and/or -m (decode)");
  if (!o.compile_schemas.empty()) {
    if (o.vocabs.empty()) return Failure("bench grammar: --compile-schemas needs --vocab");
    return RunCompileBench(o);
  }
  if (o.vocabs.empty()) return RunDecodeBench(o);
  fmt::print("trellis bench grammar  (1 thread; kernels {})\n", KernelPathName());
  fmt::print("{:<28} {:>7} {:<12} {:>11} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "vocabulary", "tokens", "schema",
             "compile ms", "cold p50", "cold p99", "warm p50", "warm p99", "positions");
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv, std::ios::app);
    if (!csv) return Failure("cannot write " + o.csv);
  }
  for (const std::string& path : o.vocabs) {
    auto loaded = LoadVocabulary(path);
    if (!loaded.ok()) return Failure(loaded.status().ToString());
    const auto& vocab = *loaded;
    const std::string vname = path.substr(path.find_last_of('/') + 1);
    for (const Schema& s : kSchemas) {
      std::vector<double> compile;
      grammar::Grammar g;
      for (int r = 0; r < 20; ++r) {
        const auto t0 = Clock::now();
        auto c = s.json[0] ? grammar::CompileJsonSchema(s.json) : grammar::ParseGbnf(grammar::JsonObjectGbnf());
        compile.push_back(Ms(Clock::now() - t0));
        if (!c.ok()) return Failure(c.status().message());
        g = std::move(*c);
      }
      auto compiled = std::make_shared<grammar::CompiledGrammar>(g, vocab);
      grammar::TokenMask mask(vocab->n_vocab());
      std::vector<double> cold, warm;
      for (int pass = 0; pass < 2; ++pass) {
        std::mt19937_64 rng(42);  // the same walks both passes: the second finds every position cached
        for (int w = 0; w < o.walks; ++w) {
          auto m = grammar::GrammarMatcher::Make(compiled);
          if (!m.ok()) return Failure(m.status().message());
          std::vector<int32_t> allowed;
          for (int step = 0; step < o.steps && !(*m)->ended(); ++step) {
            const auto t0 = Clock::now();
            if (Status st = (*m)->FillMask(mask); !st.ok()) return Failure(st.message());
            (pass == 0 ? cold : warm).push_back(Ms(Clock::now() - t0));
            allowed.clear();
            for (int32_t id = 0; id < vocab->n_vocab(); ++id) {
              if (mask.Test(id)) allowed.push_back(id);
            }
            if (allowed.empty()) return Failure("bench grammar: a dead end (a bug)");
            // Walk on (end tokens only when nothing else is allowed, so documents grow).
            int32_t pick = allowed[rng() % allowed.size()];
            for (int tries = 0; tries < 8 && vocab->is_eog(pick) && allowed.size() > 1; ++tries) pick = allowed[rng() % allowed.size()];
            if (Status st = (*m)->Accept(pick); !st.ok()) return Failure(st.message());
          }
        }
      }
      const double c50 = bench::Quantile(compile, 0.5);
      fmt::print("{:<28} {:>7} {:<12} {:>11.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>9}\n", vname, vocab->n_vocab(),
                 s.name, c50, bench::Quantile(cold, 0.5), bench::Quantile(cold, 0.99), bench::Quantile(warm, 0.5), bench::Quantile(warm, 0.99),
                 compiled->cached_positions());
      if (csv) {
        csv << fmt::format("grammar,\"{}\",{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{}\n", KernelPathName(), vname,
                           vocab->n_vocab(), s.name, c50, bench::Quantile(cold, 0.5), bench::Quantile(cold, 0.99), bench::Quantile(warm, 0.5),
                           bench::Quantile(warm, 0.99), compiled->cached_positions());
      }
    }
  }
  fmt::print("(ms per step; cold = positions computed as met, warm = all cached; compile = schema -> grammar, median of 20)\n");
  return o.model.empty() ? Status::Ok() : RunDecodeBench(o);
}

}  // namespace trellis::bench
