// trellis bench: the benchmark commands' flags and reports. The measurements live in
// src/bench (speed.h: pp and tg as llama-bench measures them) and the bench_*.cc drivers.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bench/chat.h"
#include "bench/prefix.h"
#include "cli/alloc_counter.h"
#include "bench/report.h"
#include "bench/grammar.h"
#include "bench/roofline.h"
#include "cli/bench_flags.h"
#include "bench/serve.h"
#include "bench/grid_eval.h"
#include "bench/store_eval.h"
#include "bench/store_micro.h"
#include "cli/commands.h"
#include "cli/kv_flags.h"
#include "engine/random_model.h"
#include "bench/speed.h"
#include "kernels/cpu_features.h"
#include "util/clock.h"
#include "util/cpus.h"

namespace trellis::cli {
namespace {

struct SpeedOpts {
  std::string model, csv;
  int threads = 0, pp = 512, tg = 64, reps = 5, block_size = 32, sessions = 1;  // threads 0: the physical cores
  int depth = 0;  // tokens already in the KV cache before each pp / tg test (llama-bench's -d)
  std::string threads_how;  // how the default thread count was chosen ("" with -t)
  bool json = false;
  bool limits = false;  // measure this machine's limits before and after, report fractions
  bool limits_quick = false;  // with the roofline's --quick loops (tests)
  bool thread_sweep = false;  // run at 1, 2, ..., threads threads
  bool budget = false;  // per phase of a pass: time, cycles per layer, against its own limit (implies limits)
  KvTypeFlags kv_types;
};

using bench::Median;
using bench::ChatBenchOptions;
using bench::GrammarBenchOptions;
using bench::RooflineBenchOptions;
using bench::ServeBenchOptions;
using bench::StoreBenchOptions;

// A driver's result as the exit code: its failure printed as every error is.
int Report(const Status& s) { return s.ok() ? 0 : Fail(s.message()); }

int64_t PeakRssBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// What the limits allow a model: prefill tokens/s at the arithmetic peak (int8 for
// quantized weights, f32 FMA for float ones), decode tokens/s of b sessions at the DRAM
// bandwidth (one read of the active weights per step, or b tokens of arithmetic).
struct SpeedLimits {
  double pp = 0, tg = 0, tg_batched = 0;
};
SpeedLimits LimitsFor(const Model& m, const bench::MachineLimits& l, int sessions) {
  // The layers' weight type (a mixture's experts when it has no dense FFN).
  const LayerWeights& l0 = m.layer(m.part().first_layer);
  const GgmlType t = m.n_local_layers() == 0 ? GgmlType::kF32
                     : l0.wq.rows > 0        ? l0.wq.type
                                             : l0.w_up.type;
  const bool float_weights = t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
  const double peak = float_weights ? l.f32_flops : l.int8_ops;
  const double ops = 2.0 * static_cast<double>(m.ActiveMacsPerToken());
  const double bytes = static_cast<double>(m.ActiveWeightBytes());
  auto decode = [&](int b) {
    const double step = std::max(bytes / l.dram_bytes, peak > 0 ? b * ops / peak : 0.0);
    return step > 0 ? b / step : 0.0;
  };
  return {peak > 0 ? peak / ops : 0, l.dram_bytes > 0 ? decode(1) : 0, l.dram_bytes > 0 ? decode(sessions) : 0};
}

// One test's cycle budget (--budget): per phase of its passes, the wall time per pass and
// in core cycles per layer, its share, and where the phase has one, its own limit: a
// product's multiply-adds at the int8 (float weights: f32 FMA) peak or its weight bytes at
// the DRAM bandwidth, whichever is longer; attention's FLOPs at the f32 FMA peak. The
// products' activation conversion is its own row, out of their times.
struct BudgetRow {
  std::string phase;
  double ns_per_pass = 0, cycles_per_layer = 0, share = 0, limit_ns_per_pass = 0;
};
std::vector<BudgetRow> BudgetRows(const ForwardProfile& prof, const bench::MachineLimits& lim, int layers) {
  std::vector<BudgetRow> rows;
  if (prof.passes == 0) return rows;
  const double passes = static_cast<double>(prof.passes), total = static_cast<double>(prof.TotalNs());
  auto add = [&](std::string name, double ns, double limit_ns) {
    BudgetRow r;
    r.phase = std::move(name);
    r.ns_per_pass = ns / passes;
    r.cycles_per_layer = r.ns_per_pass * 1e-9 * lim.clock_hz / std::max(layers, 1);
    r.share = total > 0 ? ns / total : 0;
    r.limit_ns_per_pass = limit_ns / passes;
    rows.push_back(std::move(r));
  };
  double act_ns = 0;
  for (int i = 0; i < ForwardProfile::kPhases; ++i) {
    const ForwardProfile::Counts& c = prof.phase[static_cast<size_t>(i)];
    double limit = 0;
    if (c.macs + c.float_macs > 0) {
      const double arith = (lim.int8_ops > 0 ? 2 * c.macs / lim.int8_ops : 0) +
                           (lim.f32_flops > 0 ? 2 * c.float_macs / lim.f32_flops : 0);
      limit = std::max(arith, lim.dram_bytes > 0 ? c.weight_bytes / lim.dram_bytes : 0) * 1e9;
    } else if (c.flops > 0 && lim.f32_flops > 0) {
      limit = c.flops / lim.f32_flops * 1e9;
    }
    if (c.ns == 0 && limit == 0) continue;
    add(ForwardProfile::Name(i), static_cast<double>(c.ns - c.act_ns), limit);
    act_ns += static_cast<double>(c.act_ns);
  }
  if (act_ns > 0) add("activation conversion (of the products)", act_ns, 0);
  return rows;
}

void PrintBudget(const std::string& test, const ForwardProfile& prof, const bench::MachineLimits& lim, int layers) {
  const std::vector<BudgetRow> rows = BudgetRows(prof, lim, layers);
  if (rows.empty()) return;
  const double tokens = static_cast<double>(prof.tokens) / static_cast<double>(prof.passes);
  std::printf("cycle budget, %s: %.0f token(s) per pass, %lld passes, %d layers, core clock %.2f GHz (cycles per "
              "layer: a pass's / layers, embeddings and logits included)\n\n",
              test.c_str(), tokens, static_cast<long long>(prof.passes), layers, lim.clock_hz * 1e-9);
  std::printf("| phase | us per pass | k cycles per layer | share | limit us per pass | fraction of limit |\n"
              "|---|---|---|---|---|---|\n");
  double ns = 0, cycles = 0, limit = 0;
  for (const BudgetRow& r : rows) {
    ns += r.ns_per_pass;
    cycles += r.cycles_per_layer;
    limit += r.limit_ns_per_pass;
    if (r.limit_ns_per_pass > 0) {
      std::printf("| %s | %.1f | %.1f | %.1f %% | %.1f | %.2f |\n", r.phase.c_str(), r.ns_per_pass * 1e-3,
                  r.cycles_per_layer * 1e-3, 100 * r.share, r.limit_ns_per_pass * 1e-3, r.limit_ns_per_pass / r.ns_per_pass);
    } else {
      std::printf("| %s | %.1f | %.1f | %.1f %% | | |\n", r.phase.c_str(), r.ns_per_pass * 1e-3, r.cycles_per_layer * 1e-3,
                  100 * r.share);
    }
  }
  std::printf("| all | %.1f | %.1f | 100 %% | %.1f | %.2f |\n\n", ns * 1e-3, cycles * 1e-3, limit * 1e-3, ns > 0 ? limit / ns : 0);
}

nlohmann::json BudgetJson(const ForwardProfile& prof, const bench::MachineLimits& lim, int layers) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BudgetRow& r : BudgetRows(prof, lim, layers)) {
    rows.push_back({{"phase", r.phase}, {"ns_per_pass", r.ns_per_pass}, {"cycles_per_layer", r.cycles_per_layer},
                    {"share", r.share}, {"limit_ns_per_pass", r.limit_ns_per_pass}});
  }
  return {{"passes", prof.passes}, {"tokens", prof.tokens}, {"layers", layers}, {"clock_hz", lim.clock_hz}, {"phases", rows}};
}

int RunSpeed(const SpeedOpts& o) {
  auto model = Model::Load(o.model);
  if (!model.ok()) return Fail(model.status().ToString());
  // Limits measured right before and right after the tests (this machine's bandwidth moves
  // from minute to minute): the fractions use their mean.
  bench::MachineLimits before, after;
  if (o.limits) {
    auto l = bench::MeasureLimits(o.threads, o.limits_quick);
    if (!l.ok()) return Fail(l.status().ToString());
    before = *l;
  }
  bench::SpeedParams sp;
  sp.threads = o.threads;
  sp.pp = o.pp;
  sp.tg = o.tg;
  sp.depth = o.depth;
  sp.reps = o.reps;
  sp.block_size = o.block_size;
  sp.sessions = o.sessions;
  sp.kv_type_k = o.kv_types.K();
  sp.kv_type_v = o.kv_types.V();
  sp.profile = o.budget;
  auto runs = bench::MeasureSpeed(**model, sp);
  if (!runs.ok()) return Fail(runs.status().ToString());
  const std::vector<double>&pp = runs->pp, &tg = runs->tg, &tgb = runs->tg_batched;
  const int d = o.depth;
  const double pp_med = pp.empty() ? 0 : Median(pp);
  const double tg_med = tg.empty() ? 0 : Median(tg);
  bench::MachineLimits lim;
  SpeedLimits ceil;
  double loop_dram = 0, decode_dram = 0;  // the read loop's mean bandwidth, and the decode's own
  if (o.limits) {
    auto l = bench::MeasureLimits(o.threads, o.limits_quick);
    if (!l.ok()) return Fail(l.status().ToString());
    after = *l;
    lim = {(before.int8_ops + after.int8_ops) / 2, (before.f32_flops + after.f32_flops) / 2,
           (before.dram_bytes + after.dram_bytes) / 2, (before.clock_hz + after.clock_hz) / 2};
    // What the decode itself streamed is bandwidth this machine has: on this VM the read
    // loop has measured less than a decode step achieved minutes later (tg at 1.01-1.19
    // of its limit), which lowered every decode limit and lifted the batched fraction
    // with it. The limits take the larger of the two. Weight bytes only, a lower bound on
    // what a step read; a batched step reads the weights once for all its sessions.
    loop_dram = lim.dram_bytes;
    const double bytes = static_cast<double>((*model)->ActiveWeightBytes());
    if (!tg.empty()) decode_dram = tg_med * bytes;
    if (!tgb.empty()) decode_dram = std::max(decode_dram, Median(tgb) / o.sessions * bytes);
    lim.dram_bytes = std::max(lim.dram_bytes, decode_dram);
    ceil = LimitsFor(**model, lim, o.sessions);
  }
  auto fraction = [](double v, double limit) { return limit > 0 ? v / limit : 0.0; };
  const int64_t rss = PeakRssBytes();
  const int layers = (*model)->n_local_layers();
  const std::string type = (*model)->TypeSummary();
  const std::string isa = KernelPathName(), cpu = CpuModelName();
  const std::string kv = o.kv_types.k + "/" + o.kv_types.v;
  if (o.json) {
    nlohmann::json j = {{"model", o.model}, {"type", type}, {"threads", o.threads}, {"isa", isa}, {"cpu", cpu}, {"kv", kv},
                        {"pp_tokens", o.pp}, {"tg_tokens", o.tg}, {"depth", d}, {"reps", o.reps},
                        {"pp_tok_s", pp_med}, {"tg_tok_s", tg_med}, {"peak_rss_bytes", rss},
                        {"pp_runs", pp}, {"tg_runs", tg}};
    if (!tgb.empty()) {
      j["sessions"] = o.sessions;
      j["tg_batched_tok_s"] = Median(tgb);
      j["tg_batched_over_single"] = Median(tgb) / tg_med;
      j["tg_batched_runs"] = tgb;
    }
    if (o.limits) {
      j["limits"] = {{"int8_ops_per_s", lim.int8_ops}, {"f32_flops_per_s", lim.f32_flops},
                     {"dram_bytes_per_s", lim.dram_bytes}, {"dram_bytes_per_s_before", before.dram_bytes},
                     {"dram_bytes_per_s_after", after.dram_bytes}, {"dram_bytes_per_s_loop", loop_dram},
                     {"dram_bytes_per_s_decode", decode_dram},
                     {"macs_per_token", (*model)->ActiveMacsPerToken()},
                     {"weight_bytes_per_token", (*model)->ActiveWeightBytes()}};
      j["pp_limit_tok_s"] = ceil.pp;
      j["pp_fraction"] = fraction(pp_med, ceil.pp);
      j["tg_limit_tok_s"] = ceil.tg;
      j["tg_fraction"] = fraction(tg_med, ceil.tg);
      if (!tgb.empty()) {
        j["tg_batched_limit_tok_s"] = ceil.tg_batched;
        j["tg_batched_fraction"] = fraction(Median(tgb), ceil.tg_batched);
      }
      j["limits"]["clock_hz"] = lim.clock_hz;
    }
    if (o.budget) {
      j["budget"] = {{"pp", BudgetJson(runs->pp_profile, lim, layers)}, {"tg", BudgetJson(runs->tg_profile, lim, layers)},
                     {"tg_batched", BudgetJson(runs->tg_batched_profile, lim, layers)}};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("cpu: %s | kernels: %s | %s | K/V cache %s\n\n", cpu.c_str(), isa.c_str(),
                ThreadsText(o.threads, o.threads_how).c_str(), kv.c_str());
    std::printf("| model | type | threads | test | tokens/s (median of %d) | min | max |\n|---|---|---|---|---|---|---|\n", o.reps);
    auto row = [&](const char* test, int n, const std::vector<double>& v) {
      if (v.empty()) return;
      const std::string at = d > 0 ? " @ d" + std::to_string(d) : "";
      std::printf("| %s | %s | %d | %s%d%s | %.2f | %.2f | %.2f |\n", o.model.c_str(), type.c_str(), o.threads, test, n,
                  at.c_str(), Median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
    };
    row("pp", o.pp, pp);
    row("tg", o.tg, tg);
    if (!tgb.empty()) {
      const std::string name = "tg" + std::to_string(o.tg) + " x" + std::to_string(o.sessions) + " sessions, aggregate: tg";
      row(name.c_str(), o.tg, tgb);
      std::printf("batched decode: %d sessions give %.2fx the tokens/s of one\n", o.sessions, Median(tgb) / tg_med);
    }
    if (o.limits) {
      std::printf("\nlimits (mean of before / after the tests): int8 dot %.0f GOP/s, f32 FMA %.0f GFLOP/s, DRAM read "
                  "%.1f GB/s (the larger of the read loop's %.1f / %.1f and the decode's own %.1f); %.3f GOP and "
                  "%.1f MB of weights per token\n\n",
                  lim.int8_ops * 1e-9, lim.f32_flops * 1e-9, lim.dram_bytes * 1e-9, before.dram_bytes * 1e-9,
                  after.dram_bytes * 1e-9, decode_dram * 1e-9, 2e-9 * static_cast<double>((*model)->ActiveMacsPerToken()),
                  1e-6 * static_cast<double>((*model)->ActiveWeightBytes()));
      std::printf("| test | tokens/s | limit tokens/s | fraction | bound |\n|---|---|---|---|---|\n");
      auto frow = [&](const std::string& test, const std::vector<double>& v, double limit, const char* bound) {
        if (!v.empty()) std::printf("| %s | %.2f | %.1f | %.2f | %s |\n", test.c_str(), Median(v), limit, fraction(Median(v), limit), bound);
      };
      frow("pp" + std::to_string(o.pp), pp, ceil.pp, "arithmetic peak");
      frow("tg" + std::to_string(o.tg), tg, ceil.tg, "DRAM bandwidth");
      frow("tg" + std::to_string(o.tg) + " x" + std::to_string(o.sessions), tgb, ceil.tg_batched,
           "DRAM bandwidth (one read per step) or arithmetic");
      std::printf("\n");
    }
    if (o.budget) {
      PrintBudget("pp" + std::to_string(o.pp), runs->pp_profile, lim, layers);
      PrintBudget("tg" + std::to_string(o.tg), runs->tg_profile, lim, layers);
      PrintBudget("tg" + std::to_string(o.tg) + " x" + std::to_string(o.sessions), runs->tg_batched_profile, lim, layers);
    }
    std::printf("peak RSS: %.1f MiB (weights %.1f MiB mmapped)\n", static_cast<double>(rss) / (1 << 20),
                static_cast<double>((*model)->WeightBytes()) / (1 << 20));
    if (const ModelConfig& c = (*model)->config(); c.moe()) {
      const double active = static_cast<double>((*model)->ActiveWeightBytes());
      std::printf("mixture of experts: %d of %d experts per token, so a decode step reads %.1f MiB of weights "
                  "(%.1f GB/s at tg's median)\n", c.n_expert_used, c.n_expert, active / (1 << 20), active * tg_med / 1e9);
    }
  }
  if (!o.csv.empty()) {
    std::ofstream f(o.csv, std::ios::app);
    if (f.tellp() == 0) f << "model,type,threads,pp_tokens,tg_tokens,pp_tok_s,tg_tok_s,peak_rss_bytes,isa,cpu,depth,kv\n";
    std::string cpu_field = cpu;
    std::replace(cpu_field.begin(), cpu_field.end(), ',', ';');
    f << o.model << "," << type << "," << o.threads << "," << o.pp << "," << o.tg << "," << pp_med << "," << tg_med
      << "," << rss << "," << isa << "," << cpu_field << "," << d << "," << kv << "\n";
    if (!f) return Fail("cannot write " + o.csv);
  }
  return 0;
}

}  // namespace

// A random-weight Q4_0 model of a named shape (engine/random_model.h), generated once into
// the cache directory ($TRELLIS_CACHE, else ~/.cache/trellis).
Result<std::string> BenchModel(const std::string& shape) {
  const char* env = std::getenv("TRELLIS_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = env ? env : std::string(home ? home : "/tmp") + "/.cache/trellis";
  const std::string path = dir + "/" + (shape == "tiny" ? shape : shape + "-shape") + "-q4_0.gguf";
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
    return path;
  }
  RandomModelOptions ro;
  TRELLIS_ASSIGN_OR_RETURN(ro.shape, ModelShapeByName(shape));
  if (std::system(("mkdir -p '" + dir + "'").c_str()) != 0) return IoError("cannot create " + dir);
  auto vocab = GgufFile::Open(DefaultVocabPath());
  if (!vocab.ok()) return vocab.status();
  ro.type = "q4_0";
  std::fprintf(stderr, "bench: generating %s\n", path.c_str());
  TRELLIS_RETURN_IF_ERROR(WriteRandomModel(ro, *vocab, path));
  return path;
}

// This executable's path ("" if unknown): the distributed benchmarks start copies of it.
std::string SelfExe() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
}

// The default benchmark models: TinyLlama's shape, or the tiny one for quick runs.
Result<std::string> DefaultModel(bool quick) { return BenchModel(quick ? "tiny" : "tinyllama"); }

// `bench serve` (bench/serve.cc): its options; the runner checks parsed() on the app.
std::pair<CLI::App*, std::shared_ptr<ServeBenchOptions>> AddServeBench(CLI::App& app) {
  CLI::App* s = app.add_subcommand("serve", "concurrent streamed chat clients sharing a system prompt against an "
                                            "OpenAI-compatible server: requests/s, TTFT, cached-token share");
  auto so = std::make_shared<ServeBenchOptions>();
  s->add_option("--url", so->url, "server base URL, e.g. http://127.0.0.1:8080 (default: start trellis serve -m MODEL)");
  s->add_option("-m,--model", so->model, "GGUF for the trellis serve started here (default: TinyLlama-shaped Q4_0)");
  s->add_option("-t,--threads", so->threads, "--threads of the trellis serve started here")->capture_default_str();
  s->add_option("--serve-args", so->serve_args, "extra arguments for the trellis serve started here, space-separated");
  s->add_option("-C,--clients", so->clients, "concurrent clients C")->capture_default_str();
  s->add_option("-R,--requests", so->requests, "requests per client R, sent one after another")->capture_default_str();
  s->add_option("-S,--system-tokens", so->system_tokens, "shared system prompt tokens S (calibrated via /tokenize)")->capture_default_str();
  s->add_option("-M,--max-tokens", so->max_tokens, "max_tokens M per request")->capture_default_str();
  s->add_option("--warmup", so->warmup, "unmeasured requests with the system prompt sent first")->capture_default_str();
  s->add_flag("--completions", so->completions, "use /v1/completions instead of /v1/chat/completions");
  s->add_flag("--ban-bytes", so->ban_bytes, "send logit_bias banning token ids 0..258 (llama-server on random weights)");
  s->add_flag("--keep-alive", so->keep_alive, "reuse each client's connection (default: one connection per request)");
  s->add_option("--model-name", so->model_name, "\"model\" field of the requests (default: omitted)");
  s->add_option("--api-key", so->api_key, "send Authorization: Bearer KEY");
  s->add_option("--label", so->label, "server name in the table and CSV (default: trellis, or the URL)");
  s->add_option("-o,--out", so->out_dir, "results folder (serve.csv, requests-LABEL.csv, server.log)")->capture_default_str();
  s->add_option("--timeout", so->timeout_s, "seconds to wait for one answer")->capture_default_str();
  s->add_flag("--json", so->json, "print one JSON object instead of the table");
  return {s, so};
}

// `bench chat` and `bench agent` (bench/chat.cc): their options; the runner checks
// parsed() on the app.
std::pair<CLI::App*, std::shared_ptr<ChatBenchOptions>> AddChatBench(CLI::App& app, bool agent) {
  CLI::App* s = agent ? app.add_subcommand("agent", "agents in a tool loop: N agents sharing a tool-definition system "
                                                    "prompt, every turn a forced call and its result; prompt, cached "
                                                    "tokens and TTFT per turn, against trellis serve and llama-server")
                      : app.add_subcommand("chat", "multi-turn streamed conversations carrying their whole history: prompt, "
                                                   "cached tokens and TTFT per turn, against trellis serve and llama-server");
  auto co = std::make_shared<ChatBenchOptions>();
  if (agent) {  // both servers render Qwen 2.5's template (<tool_call> blocks, tools in the system turn)
    co->tools = 1;
    co->serve_args = "--ctx-size 4096";  // TinyLlama's 2048 is too short for the tool definitions and 6 turns
    co->turns = 6;
    co->system_tokens = 2200;  // about 2.6k rendered: 6 turns fit the 4096 context
    co->reply_tokens = 160;
    co->conversations = 4;
    co->out_dir = "results/agent";
    co->template_file = std::string(TRELLIS_SOURCE_DIR) + "/tests/data/templates/Qwen-Qwen2.5-7B-Instruct.jinja";
    co->llama_template = co->template_file;
  }
  s->add_option("-m,--model", co->model, "GGUF for the servers started here (default: TinyLlama-shaped Q4_0)");
  s->add_option("--url", co->url, "a running trellis (or other) server instead of starting trellis serve -m MODEL");
  s->add_option("--label", co->label, "name of that server in the table and CSV")->capture_default_str();
  s->add_option("--llama-server", co->llama_server, "also run llama.cpp's llama-server (this binary) on -m MODEL");
  s->add_option("--llama-np", co->llama_np, "llama-server -np (default: one slot per conversation)");
  s->add_option("--llama-ctx", co->llama_ctx, "llama-server -c (default: 2048 per slot)");
  s->add_option("--llama-template", co->llama_template,
                "llama-server --chat-template-file (default: tests/data/templates/TinyLlama-1.1B-Chat-v1.0.jinja)");
  s->add_option("--llama-args", co->llama_args, "extra llama-server arguments, space-separated");
  s->add_flag("!--no-ban-bytes", co->llama_ban_bytes,
              "do not send both servers logit_bias banning ids 0..258 (llama-server needs it with random weights)");
  s->add_option("-T,--turns", co->turns, "turns per conversation")->capture_default_str();
  s->add_option("-S,--system-tokens", co->system_tokens,
                agent ? "tool definitions' tokens (about; sized via /tokenize)" : "system prompt tokens (about; sized via /tokenize)")
      ->capture_default_str();
  s->add_option("-W,--question-words", co->question_words, "words per user message")->capture_default_str();
  s->add_option("-M,--reply-tokens", co->reply_tokens, "max_tokens of each reply")->capture_default_str();
  s->add_option("-C,--conversations", co->conversations, "conversations run in parallel")->capture_default_str();
  s->add_option("--seed", co->seed, "seed of the user messages")->capture_default_str();
  s->add_option("-t,--threads", co->threads, "--threads of each server started here")->capture_default_str();
  s->add_option("--serve-args", co->serve_args, "extra arguments for the trellis serve started here, space-separated");
  s->add_option("--warmup", co->warmup, "unmeasured one-token requests sent to each server first")->capture_default_str();
  s->add_option("--timeout", co->timeout_s, "seconds to wait for one answer")->capture_default_str();
  s->add_option("-o,--out", co->out_dir, "results folder (chat.csv, chat.png, server logs)")->capture_default_str();
  s->add_option("--template", co->template_file, "Jinja chat template for both servers (trellis --chat-template, "
                "llama-server --chat-template-file)");
  s->add_flag("--json", co->json, "print one JSON object instead of the table");
  return {s, co};
}

Runner AddBenchCommand(CLI::App& app) {
  app.require_subcommand(1);
  auto sto = std::make_shared<StoreBenchOptions>();
  auto seo = std::make_shared<bench::StoreEvalOptions>();
  CLI::App* st = app.add_subcommand("store", "the PTStore evaluation in miniature: nodes on emulated links, five cache "
                                             "configurations, TTFT against context length and node count, "
                                             "single-flight, miss-ratio curve (--micro: the transport alone)");
  st->add_flag("--micro", sto->micro, "the transport micro-benchmarks instead: bulk get against ucx_perftest, lookup latency");
  st->add_option("-m,--model", seo->model, "GGUF every node serves (default: the ptstore shape, generated once)");
  st->add_option("--contexts", seo->contexts, "context lengths in tokens (passage + question)")->delimiter(',')->capture_default_str();
  st->add_option("--nodes", seo->nodes, "node counts; the largest is the context sweep's")->delimiter(',')->capture_default_str();
  st->add_option("--traces", seo->traces, "squad, wikiqa")->delimiter(',')->capture_default_str();
  st->add_option("--rate", seo->rate, "tc tbf rate of every node's link")->capture_default_str();
  st->add_flag("--loopback", seo->loopback, "no network namespaces: nodes on 127.0.0.1 (ports apart), links not shaped (no root needed)");
  st->add_option("-t,--threads", seo->threads, "compute threads per node")->capture_default_str();
  st->add_option("--kv-contexts", seo->kv_contexts, "full contexts each node's KV pool holds")->capture_default_str();
  st->add_option("--kv-type", seo->kv_type, "every node's K and V cache type (f16, q8_0, q4_0)")
      ->check(CLI::IsMember({"f16", "q8_0", "q4_0"}))
      ->capture_default_str();
  st->add_option("--single-flight-reps", seo->single_flight_reps, "new contexts sent to every node at once")->capture_default_str();
  st->add_option("--phi-rounds", seo->phi_rounds, "alternating rounds of the phi 0.9 comparison")->capture_default_str();
  st->add_flag("--quick", seo->quick, "the tiny model, short contexts, 2 nodes, small traces: about a minute (CI)");
  st->add_flag("--no-plots", [seo](int64_t) { seo->plots = false; }, "skip the gnuplot PNGs");
  st->add_option("--blocks", sto->blocks, "blocks in the bulk get")->capture_default_str();
  st->add_option("--block-bytes", sto->block_bytes, "bytes per block (704 KiB: TinyLlama's 32-token block)")->capture_default_str();
  st->add_option("-r,--runs", sto->runs, "timed gets per round (median)")->capture_default_str();
  st->add_option("--rounds", sto->rounds, "rounds alternating the store and ucx_perftest")->capture_default_str();
  st->add_option("--servers", sto->servers, "store processes in the lookup test")->capture_default_str();
  st->add_option("--prompt-tokens", sto->prompt_tokens, "tokens of the looked-up prompt")->capture_default_str();
  st->add_option("--lookups", sto->lookups, "timed lookups")->capture_default_str();
  st->add_flag("--no-perftest", sto->no_perftest, "skip ucx_perftest (ucx-utils)");
  st->add_option("-o,--out", sto->out, "results folder (default: results/store for --micro, results/store-eval)");
  auto geo = std::make_shared<bench::GridEvalOptions>();
  CLI::App* gr = app.add_subcommand("grid", "the grid against one process: 1-3 processes on loopback and emulated links, "
                                            "decode tokens/s (1 and 8 sessions), TTFT, TTFT(phi), memory per process, "
                                            "bytes per token, and the pipeline model's predictions");
  gr->add_option("-m,--model", geo->model, "GGUF (default: TinyLlama-shaped Q4_0, generated once)");
  gr->add_option("--nodes", geo->nodes, "grid sizes in processes (1: one process)")->delimiter(',')->capture_default_str();
  gr->add_option("--rate", geo->rate, "tc tbf rate of every node's link (namespace runs)")->capture_default_str();
  gr->add_flag("--no-netns", [geo](int64_t) { geo->netns = false; }, "skip the network-namespace runs");
  gr->add_flag("--no-loopback", [geo](int64_t) { geo->loopback = false; }, "skip the loopback runs");
  gr->add_option("-S,--sessions", geo->sessions, "sessions of the aggregate decode")->capture_default_str();
  gr->add_option("-n,--decode-tokens", geo->decode_tokens, "tokens per decode run")->capture_default_str();
  gr->add_option("-L,--prompt", geo->prompt, "prompt tokens of the TTFT runs")->capture_default_str();
  gr->add_option("--phi", geo->phi, "shared-prefix share of the TTFT(phi) check")->capture_default_str();
  gr->add_option("-r,--reps", geo->reps, "alternating repetitions (medians)")->capture_default_str();
  gr->add_option("--node-threads", geo->node_threads, "threads of each grid process (and of the 1-node run)")->capture_default_str();
  gr->add_option("--baseline-threads", geo->baseline_threads, "threads of the one-process baseline")->capture_default_str();
  gr->add_option("--depth", geo->depth, "--grid-depth")->capture_default_str();
  gr->add_option("--chunk", geo->chunk, "--grid-chunk")->capture_default_str();
  gr->add_option("--predict-nodes", geo->predict_nodes, "processes of the extra prediction")->capture_default_str();
  gr->add_option("--predict-gbit", geo->predict_gbit, "link of the extra prediction, Gbit/s")->capture_default_str();
  gr->add_flag("--no-store", [geo](int64_t) { geo->store = false; }, "skip the prefix-store runs (TTFT from the store on a new head)");
  gr->add_flag("--quick", geo->quick, "the tiny model, short runs, one repetition (CI)");
  gr->add_flag("--no-plots", [geo](int64_t) { geo->plots = false; }, "skip the gnuplot PNGs");
  gr->add_option("-o,--out", geo->out, "results folder")->capture_default_str();
  CLI::App* prefix = app.add_subcommand("prefix", "RadixAttention benchmarks: throughput, TTFT and tree size vs shared prefix and block size");
  auto po = std::make_shared<bench::PrefixBenchOptions>();
  po->heap_allocations = HeapAllocations;
  prefix->add_option("-m,--model", po->model, "GGUF model (default: TinyLlama-shaped Q4_0, generated once)");
  prefix->add_option("-o,--out", po->out_dir, "results folder (CSV, markdown, PNG)")->capture_default_str();
  prefix->add_option("-L,--prompt-len", po->L, "prompt length L")->capture_default_str();
  prefix->add_option("-D,--decode", po->D, "tokens decoded per session D")->capture_default_str();
  prefix->add_option("-N,--sessions", po->N, "concurrent sessions N")->capture_default_str();
  prefix->add_option("-B,--block-size", po->block_size, "KV block size B")->capture_default_str();
  prefix->add_option("-r,--reps", po->reps, "repetitions (median reported)")->capture_default_str();
  prefix->add_option("-t,--threads", po->threads, kThreadsHelp);
  prefix->add_flag("--quick", po->quick, "the tiny model, fewer lengths: seconds");
  prefix->add_flag("--json", po->json, "print every measured point as a JSON line");
  prefix->add_option("--only", po->only, "run one figure: throughput, ttft or blocksize")
      ->check(CLI::IsMember({"throughput", "ttft", "blocksize"}));
  CLI::App* speed = app.add_subcommand("speed", "prompt processing and generation tokens/s (llama-bench style)");
  auto o = std::make_shared<SpeedOpts>();
  speed->add_option("-m,--model", o->model, "GGUF model")->required();
  speed->add_option("-t,--threads", o->threads, kThreadsHelp);
  speed->add_option("-p,--n-prompt", o->pp, "prompt tokens (pp test)")->capture_default_str();
  speed->add_option("-n,--n-gen", o->tg, "generated tokens (tg test)")->capture_default_str();
  speed->add_option("-d,--n-depth", o->depth,
                    "tokens already in the KV cache before each pp and tg test (llama-bench's -d): prefill or decode "
                    "at depth, attending to them")->capture_default_str();
  speed->add_option("-r,--reps", o->reps, "repetitions (median reported)")->capture_default_str();
  speed->add_option("--block-size", o->block_size, "KV block size")->capture_default_str();
  speed->add_option("-s,--sessions", o->sessions, "also decode this many sessions at once (aggregate tok/s)")->capture_default_str();
  speed->add_flag("--json", o->json, "print one JSON object");
  speed->add_flag("--limits", o->limits,
                  "measure this machine's limits (`bench roofline`'s int8 / f32 peaks and DRAM bandwidth) right before "
                  "and after the tests and report each figure as a fraction of what they allow (~7 s more)");
  speed->add_flag("--thread-sweep", o->thread_sweep,
                  "run the tests at 1, 2, ..., -t threads (thread scaling; with --limits, each against the limits "
                  "at its own thread count)");
  speed->add_flag("--budget", o->budget,
                  "also where each test's time goes: per phase of a forward pass (norms, products, attention, ...) "
                  "the time, core cycles per layer and the fraction of its own limit (implies --limits)");
  speed->add_flag("--limits-quick", o->limits_quick, "--limits with the roofline's --quick loops (~1 s; a smoke test)")
      ->group("");
  AddKvTypeFlags(*speed, &o->kv_types);
  speed->add_option("--csv", o->csv, "append a CSV row to this file");
  auto serve = AddServeBench(app);
  auto roofline = AddRooflineBench(app);
  auto grammar_bench = AddGrammarBench(app);
  auto chat = AddChatBench(app, /*agent=*/false);
  auto agent = AddChatBench(app, /*agent=*/true);
  return [o, speed, prefix, po, serve, roofline, grammar_bench, chat, agent, st, sto, seo, gr, geo] {
    if (gr->parsed()) {
      if (geo->quick) {
        if (gr->count("--reps") == 0) geo->reps = 1;
        if (gr->count("--decode-tokens") == 0) geo->decode_tokens = 16;
        if (gr->count("--prompt") == 0) geo->prompt = 128;
        if (gr->count("--chunk") == 0) geo->chunk = 32;
      }
      if (geo->model.empty()) {
        auto m = DefaultModel(geo->quick);
        if (!m.ok()) return Fail(m.status().ToString());
        geo->model = *m;
      }
      geo->trellis = SelfExe();
      if (geo->trellis.empty()) return Fail("bench grid: cannot find this executable");
      return bench::RunGridEval(*geo);
    }
    if (st->parsed() && sto->micro) return Report(bench::RunStoreBench(*sto));
    if (st->parsed()) {
      if (seo->quick) {
        if (st->count("--contexts") == 0) seo->contexts = {256, 512};
        if (st->count("--nodes") == 0) seo->nodes = {1, 2};
        seo->single_flight_reps = std::min(seo->single_flight_reps, 2);
        seo->phi_rounds = std::min(seo->phi_rounds, 1);
      }
      seo->out = st->count("--out") ? sto->out : "results/store-eval";
      if (seo->model.empty()) {
        auto m = BenchModel(seo->quick ? "tiny" : "ptstore");
        if (!m.ok()) return Fail(m.status().ToString());
        seo->model = *m;
      }
      seo->trellis = SelfExe();
      if (seo->trellis.empty()) return Fail("bench store: cannot find this executable");
      return bench::RunStoreEval(*seo);
    }
    if (roofline.first->parsed()) return Report(bench::RunRooflineBench(*roofline.second));
    if (grammar_bench.first->parsed()) return Report(bench::RunGrammarBench(*grammar_bench.second));
    for (auto& c : {chat, agent}) {
      if (!c.first->parsed()) continue;
      if (c.second->model.empty() && (c.second->url.empty() || !c.second->llama_server.empty())) {
        auto m = DefaultModel(false);
        if (!m.ok()) return Fail(m.status().ToString());
        c.second->model = *m;
      }
      return Report(bench::RunChatBench(*c.second));
    }
    if (serve.first->parsed()) {
      if (serve.second->url.empty() && serve.second->model.empty()) {
        auto m = DefaultModel(false);
        if (!m.ok()) return Fail(m.status().ToString());
        serve.second->model = *m;
      }
      return Report(bench::RunServeBench(*serve.second));
    }
    if (prefix->parsed()) {
      if (po->model.empty()) {
        auto m = DefaultModel(po->quick);
        if (!m.ok()) return Fail(m.status().ToString());
        po->model = *m;
      }
      if (po->L < 2 || po->D < 1 || po->N < 1 || po->reps < 1) return Fail("bench prefix: L >= 2, D, N, reps >= 1");
      if (po->threads < 0) return Fail("bench prefix: --threads must be >= 0 (0 = the physical cores available)");
      po->threads = ResolveThreads(po->threads);
      return Report(bench::RunPrefixBench(*po));
    }
    if (!speed->parsed()) return Fail("bench: choose a benchmark (speed, prefix, serve, chat, agent, grammar, roofline, store, grid)");
    if (o->reps < 1 || o->pp < 0 || o->tg < 0) return Fail("bench: reps >= 1, n-prompt and n-gen >= 0");
    if (o->sessions < 1 || o->sessions > 256) return Fail("bench: --sessions must be in 1..256");
    if (o->sessions > 1 && o->tg == 0) return Fail("bench: --sessions needs generated tokens (-n > 0)");
    // Both 0 would size an empty KV block table (table.back() on it crashed).
    if (o->pp == 0 && o->tg == 0) return Fail("bench: nothing to measure (n-prompt and n-gen are both 0)");
    if (o->pp > (1 << 20) || o->tg > (1 << 20)) return Fail("bench: n-prompt and n-gen must be <= 1048576");
    if (o->depth < 0 || o->depth > (1 << 20)) return Fail("bench: n-depth must be in 0..1048576");
    if (o->threads < 0) return Fail("bench: --threads must be >= 0 (0 = the physical cores available)");
    o->threads = ResolveThreads(o->threads, &o->threads_how);
    o->limits = o->limits || o->limits_quick || o->budget;
    if (!o->thread_sweep) return RunSpeed(*o);
    // Thread scaling: the same tests at 1..threads threads, a table (or JSON object) each.
    const int n = o->threads;
    for (int t = 1; t <= n; ++t) {
      SpeedOpts one = *o;
      one.threads = t;
      one.threads_how.clear();
      if (!o->json) std::printf("%s## %d thread%s\n\n", t > 1 ? "\n" : "", t, t > 1 ? "s" : "");
      std::fflush(stdout);
      if (int rc = RunSpeed(one); rc != 0) return rc;
    }
    return 0;
  };
}

}  // namespace trellis::cli
