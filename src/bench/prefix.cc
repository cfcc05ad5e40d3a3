// trellis bench prefix: the RadixAttention benchmarks of the brief (Part 1), in process.
//
// Workload: a shared "system prompt" S of random tokens; session i's prompt is the first
// P = round(phi * L / B) * B tokens of S followed by its own random suffix, L tokens in
// all; every session decodes D tokens (end-of-generation ignored).
//   throughput  one op = fresh scheduler (pool, tree) + warm S[0:P] + N sessions run to
//               completion concurrently; generated tokens / op seconds, heap allocations
//               per op, KV blocks allocated vs acquired, prompt tokens run through the
//               model (warm-up included; checked against the scheduler's token count).
//   ttft        concurrency 1: warm with S (L tokens), then time one probe sharing
//               S[0:P] (phi = 1: the probe differs from S in its last token only, so it
//               diverges inside the last block); the process's first probe is reported
//               apart as the cold start.
//   blocksize   radix-tree leaves after N sessions whose prompts leave the system prompt
//               at staggered points (session i shares (i+1)/(N+1) of it) and decode 16
//               tokens, and the TTFT of a probe sharing 3/4 of a warm prompt, for B in
//               {8..128}; mean and standard deviation over several prompt lengths.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "bench/prefix.h"
#include "bench/report.h"
#include "engine/random_model.h"
#include "engine/scheduler.h"
#include "util/clock.h"

namespace trellis::bench {
namespace {

double Stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = Mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

struct Bench {
  Bench(const Model& m, const PrefixBenchOptions& o) : model_(m), o_(o), pool_(o.threads), rng_(1234) {
    const int n_vocab = m.config().n_vocab;
    system_ = RandomTokens(4096, n_vocab);
  }

  std::vector<int32_t> RandomTokens(size_t n, int n_vocab) {
    std::uniform_int_distribution<int32_t> d(3, n_vocab - 1);
    std::vector<int32_t> v(n);
    for (auto& t : v) t = d(rng_);
    return v;
  }

  SchedulerOptions Options(int block_size, int n_sessions, int L, int D) const {
    SchedulerOptions so;
    so.block_size = block_size;
    so.n_ctx = L + D + block_size;
    so.kv_blocks = static_cast<int64_t>(n_sessions + 2) * ((L + D) / block_size + 2);
    so.max_batch_tokens = 512;
    so.prefill_chunk = 512;
    so.max_running = std::max(n_sessions, 1);
    return so;
  }

  // Runs requests concurrently to completion; returns per-request results.
  Result<std::vector<RequestResult>> Run(Scheduler& s, const std::vector<Request>& reqs) {
    std::vector<RequestResult> out(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto id = s.Submit(reqs[i], nullptr, [&out, i](RequestId, const RequestResult& r) { out[i] = r; });
      if (!id.ok()) return Failure("bench prefix: " + id.status().ToString());
    }
    s.RunUntilIdle();
    return out;
  }

  int64_t HeapAllocations() const { return o_.heap_allocations ? o_.heap_allocations() : 0; }

  Request Make(std::vector<int32_t> prompt, int max_tokens) const {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    return r;
  }

  int PrefixTokens(double phi, int L, int B) const {
    return static_cast<int>(std::lround(phi * L / B)) * B;
  }

  Result<nlohmann::json> ThroughputPoint(double phi, int L, int D, int N, int B) {
    const int n_vocab = model_.config().n_vocab;
    const int P = std::min(PrefixTokens(phi, L, B), L);
    std::vector<Request> sessions;
    for (int i = 0; i < N; ++i) {
      std::vector<int32_t> p(system_.begin(), system_.begin() + P);
      auto suffix = RandomTokens(static_cast<size_t>(L - P), n_vocab);
      p.insert(p.end(), suffix.begin(), suffix.end());
      sessions.push_back(Make(std::move(p), D));
    }
    std::vector<double> secs, allocs, thr;
    SchedulerMetrics last;
    int64_t prompt_computed = 0;
    for (int r = 0; r < o_.reps; ++r) {
      const int64_t a0 = HeapAllocations();
      const double t0 = NowSeconds();
      auto sched = Scheduler::Create(model_, Options(B, N, L, D), pool_);
      if (!sched.ok()) return Failure("bench prefix: " + sched.status().ToString());
      std::vector<RequestResult> res;
      if (P > 0) {
        TRELLIS_ASSIGN_OR_RETURN(res, Run(**sched, {Make(std::vector<int32_t>(system_.begin(), system_.begin() + P), 1)}));
      }
      TRELLIS_ASSIGN_OR_RETURN(auto res_sessions, Run(**sched, sessions));
      const double dt = NowSeconds() - t0;
      last = (*sched)->metrics();
      sched->reset();
      allocs.push_back(static_cast<double>(HeapAllocations() - a0));
      secs.push_back(dt);
      int64_t gen = 0;
      for (const auto& x : res_sessions) gen += static_cast<int64_t>(x.tokens.size());
      thr.push_back(static_cast<double>(gen) / dt);
      res.insert(res.end(), res_sessions.begin(), res_sessions.end());
      TRELLIS_ASSIGN_OR_RETURN(prompt_computed, PromptTokensComputed(res, last));
    }
    return nlohmann::json{{"figure", "throughput"}, {"phi", phi}, {"L", L}, {"D", D}, {"N", N}, {"B", B},
            {"prefix_tokens", P}, {"op_seconds", Median(secs)}, {"tok_s", Median(thr)},
            {"heap_allocs_per_op", Median(allocs)}, {"blocks_allocated", last.blocks_allocated},
            {"blocks_acquired", last.blocks_acquired}, {"computed_tokens", last.computed_tokens},
            {"prompt_tokens_computed", prompt_computed}, {"cached_tokens", last.cached_tokens}, {"reps", o_.reps}};
  }

  // Prompt tokens run through the model in one op: each request's prompt less what it took
  // from the cache. The scheduler's computed_tokens also counts decode steps, one per
  // generated token except the last (never fed back), so the two must agree exactly;
  // a preemption would recompute blocks and break that, and the figure with it.
  static Result<int64_t> PromptTokensComputed(const std::vector<RequestResult>& res, const SchedulerMetrics& m) {
    int64_t prompt = 0, decode = 0;
    for (const auto& r : res) {
      prompt += r.n_prompt - r.n_cached;
      decode += std::max<int64_t>(0, static_cast<int64_t>(r.tokens.size()) - 1);
    }
    if (m.preemptions != 0 || prompt + decode != m.computed_tokens) {
      return Failure("bench prefix: " + std::to_string(prompt) + " prompt + " + std::to_string(decode) +
                     " decode tokens != " + std::to_string(m.computed_tokens) + " computed (" +
                     std::to_string(m.preemptions) + " preemptions)");
    }
    return prompt;
  }

  // Returns {ttft seconds of each rep, cached tokens}.
  Result<std::pair<std::vector<double>, int>> Ttft(double phi, int L, int B, int reps) {
    const int n_vocab = model_.config().n_vocab;
    std::vector<int32_t> warm(system_.begin(), system_.begin() + L);
    std::vector<int32_t> probe;
    if (phi >= 1.0) {
      probe = warm;
      probe.back() = probe.back() == 3 ? 4 : 3;  // diverge in the last block
    } else {
      const int P = std::min(PrefixTokens(phi, L, B), L);
      probe.assign(system_.begin(), system_.begin() + P);
      auto suffix = RandomTokens(static_cast<size_t>(L - P), n_vocab);
      if (P < L && suffix[0] == system_[static_cast<size_t>(P)]) suffix[0] = suffix[0] == 3 ? 4 : 3;
      probe.insert(probe.end(), suffix.begin(), suffix.end());
    }
    std::vector<double> t;
    int cached = 0;
    for (int r = 0; r < reps; ++r) {
      auto sched = Scheduler::Create(model_, Options(B, 1, L, 1), pool_);
      if (!sched.ok()) return Failure("bench prefix: " + sched.status().ToString());
      TRELLIS_RETURN_IF_ERROR(Run(**sched, {Make(warm, 1)}).status());
      TRELLIS_ASSIGN_OR_RETURN(auto res, Run(**sched, {Make(probe, 1)}));
      t.push_back(res[0].ttft_seconds);
      cached = res[0].n_cached;
    }
    return std::pair<std::vector<double>, int>(t, cached);
  }

  const Model& model_;
  PrefixBenchOptions o_;
  ThreadPool pool_;
  std::mt19937 rng_;
  std::vector<int32_t> system_;
};

void Emit(const PrefixBenchOptions& o, const nlohmann::json& j) {
  if (o.json) std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

void WritePlots(const std::string& dir) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "bench prefix: gnuplot not found, PNG plots skipped (apt-get install gnuplot-nox)\n");
    return;
  }
  const std::string gp = dir + "/plots.gp";
  auto exists = [&](const char* name) { return std::ifstream(dir + "/" + name).good(); };
  std::ofstream f(gp);
  f << "set terminal pngcairo size 900,540 noenhanced\nset datafile separator ','\nset key top left\nset grid\n";
  if (exists("throughput.csv")) {
    f << "set output '" << dir << "/throughput.png'\n"
      << "set title 'Generation throughput and KV blocks per op vs shared-prefix fraction'\n"
      << "set xlabel 'phi (shared prefix fraction)'\nset ylabel 'generated tokens/s'\nset y2label 'KV blocks per op'\n"
      << "set ytics nomirror\nset y2tics\nset yrange [0:*]\nset y2range [0:*]\n"
      << "plot '" << dir << "/throughput.csv' using 1:3 skip 1 with linespoints lw 2 title 'generated tokens/s', "
      << "'' using 1:5 skip 1 axes x1y2 with linespoints lw 2 title 'KV blocks allocated', "
      << "'' using 1:6 skip 1 axes x1y2 with linespoints lw 2 title 'KV blocks acquired (shared)'\n"
      << "set yrange [*:*]\nset y2range [*:*]\nunset y2tics\nunset y2label\nset ytics mirror\n";
  }
  if (exists("ttft.csv")) {
    f << "set output '" << dir << "/ttft.png'\n"
      << "set title 'TTFT vs shared-prefix fraction (concurrency 1)'\nset xlabel 'phi'\nset ylabel 'TTFT (ms)'\n"
      << "set key top right\n"
      << "plot '" << dir << "/ttft.csv' using 1:3 skip 1 with linespoints lw 2 title 'trellis', "
      << "'' using 1:6 skip 1 with lines dt 2 title 'bound (1-hit)TTFT(0)+5%'\n";
  }
  if (exists("blocksize.csv")) {
    f << "set output '" << dir << "/blocksize.png'\n"
      << "set title 'Radix-tree nodes and TTFT vs block size (mean +- sd over prompt lengths)'\n"
      << "set xlabel 'block size B (tokens)'\nset logscale x 2\nset ylabel 'tree nodes'\nset y2label 'TTFT (ms)'\n"
      << "set ytics nomirror\nset y2tics\nset key top center\n"
      << "plot '" << dir << "/blocksize.csv' using 1:6:7 skip 1 with yerrorlines lw 2 title 'nodes', "
      << "'' using 1:2:3 skip 1 with yerrorlines lw 2 title 'leaves', "
      << "'' using 1:4:5 skip 1 axes x1y2 with yerrorlines lw 2 title 'TTFT'\n";
  }
  f.close();
  if (std::system(("gnuplot '" + gp + "'").c_str()) != 0) std::fprintf(stderr, "bench prefix: gnuplot failed\n");
}

}  // namespace

Status RunPrefixBench(const PrefixBenchOptions& in) {
  PrefixBenchOptions o = in;
  auto model = Model::Load(o.model);
  if (!model.ok()) return Failure(model.status().ToString());
  ::mkdir(o.out_dir.c_str(), 0755);
  Bench bench(**model, o);
  const int L = o.L, D = o.D, N = o.N, B = o.block_size;
  const std::vector<double> phis = {0, 0.1, 0.25, 0.5, 0.75, 0.9};
  std::string md = "# trellis bench prefix\n\nmodel: `" + o.model + "` (" + (*model)->TypeSummary() +
                   "), threads " + std::to_string(o.threads) + ", median of " + std::to_string(o.reps) + "\n\n";
  std::fprintf(stderr, "bench prefix: %s, L=%d D=%d N=%d B=%d, %d reps\n", o.model.c_str(), L, D, N, B, o.reps);

  auto want = [&](const char* fig) { return o.only.empty() || o.only == fig; };
  // Figure 1: throughput and allocations vs phi.
  if (want("throughput")) {
    std::ofstream csv(o.out_dir + "/throughput.csv");
    csv << "phi,prefix_tokens,tok_s,heap_allocs_per_op,blocks_allocated,blocks_acquired,computed_tokens,op_seconds,"
           "prompt_tokens_computed\n";
    md += "## Throughput and allocations per op (L = " + std::to_string(L) + ", D = " + std::to_string(D) +
          ", N = " + std::to_string(N) + ", B = " + std::to_string(B) + ")\n\n"
          "| phi | prefix tokens | generated tok/s | op s | heap allocs/op | KV blocks allocated | KV blocks acquired | "
          "prompt tokens computed (warm-up included) |\n"
          "|---|---|---|---|---|---|---|---|\n";
    for (double phi : phis) {
      TRELLIS_ASSIGN_OR_RETURN(nlohmann::json j, bench.ThroughputPoint(phi, L, D, N, B));
      Emit(o, j);
      csv << phi << "," << j["prefix_tokens"] << "," << j["tok_s"] << "," << j["heap_allocs_per_op"] << ","
          << j["blocks_allocated"] << "," << j["blocks_acquired"] << "," << j["computed_tokens"] << "," << j["op_seconds"]
          << "," << j["prompt_tokens_computed"] << "\n";
      char row[256];
      std::snprintf(row, sizeof row, "| %.2f | %d | %.2f | %.2f | %.0f | %ld | %ld | %ld |\n", phi,
                    j["prefix_tokens"].get<int>(), j["tok_s"].get<double>(), j["op_seconds"].get<double>(),
                    j["heap_allocs_per_op"].get<double>(), j["blocks_allocated"].get<long>(),
                    j["blocks_acquired"].get<long>(), j["prompt_tokens_computed"].get<long>());
      md += row;
      std::fprintf(stderr, "%s", row);
    }
  }

  // Figure 2: TTFT vs phi. Trellis only: a comparison with another server belongs in a
  // run that measures both (bench/llamacpp_server_prefix.py), not in numbers copied here.
  if (want("ttft")) {
    TRELLIS_ASSIGN_OR_RETURN(auto cold, bench.Ttft(0, L, B, 1));
    std::vector<double> phis2 = {0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0};
    std::ofstream csv(o.out_dir + "/ttft.csv");
    csv << "phi,cached_tokens,ttft_ms,ttft_min_ms,ttft_max_ms,bound_ms,hit\n";
    md += "\n## TTFT vs phi (L = " + std::to_string(L) + ", concurrency 1, probe decodes 1 token)\n\n"
          "cold start (first probe of the process, phi = 0): " + std::to_string(static_cast<int>(cold.first[0] * 1e3)) +
          " ms\n\n| phi | cached tokens | hit | TTFT ms (median) | bound ms | within bound |\n|---|---|---|---|---|---|\n";
    double ttft0 = 0;
    for (double phi : phis2) {
      TRELLIS_ASSIGN_OR_RETURN(auto tc, bench.Ttft(phi, L, B, o.reps));
      auto& [t, cached] = tc;
      const double ms = Median(t) * 1e3;
      if (phi == 0) ttft0 = ms;
      const double hit = static_cast<double>(cached) / L;
      const double bound = (1 - hit) * ttft0 + 0.05 * ttft0;
      Emit(o, {{"figure", "ttft"}, {"phi", phi}, {"L", L}, {"B", B}, {"cached_tokens", cached}, {"hit", hit},
               {"ttft_ms", ms}, {"bound_ms", bound}, {"runs_ms", t}});
      csv << phi << "," << cached << "," << ms << "," << *std::min_element(t.begin(), t.end()) * 1e3 << ","
          << *std::max_element(t.begin(), t.end()) * 1e3 << "," << bound << "," << hit << "\n";
      char row[256];
      std::snprintf(row, sizeof row, "| %.2f | %d | %.3f | %.1f | %.1f | %s |\n", phi, cached, hit, ms, bound,
                    ms <= bound ? "yes" : "NO");
      md += row;
      std::fprintf(stderr, "%s", row);
    }
  }

  // Figure 3: leaves and TTFT vs block size.
  if (want("blocksize")) {
    std::ofstream csv(o.out_dir + "/blocksize.csv");
    csv << "B,leaves_mean,leaves_sd,ttft_ms_mean,ttft_ms_sd,nodes_mean,nodes_sd\n";
    md += "\n## Radix-tree leaves and TTFT vs block size (N = " + std::to_string(N) +
          " sessions leaving a shared prompt at staggered points, 16 decoded tokens each; probe sharing 3/4; "
          "mean +- sd over L in " + std::string(o.quick ? "{128, 256}" : "{128, 256, 384, 512}") + ")\n\n"
          "| B | leaves | nodes | TTFT ms |\n|---|---|---|---|\n";
    const std::vector<int> lengths = o.quick ? std::vector<int>{128, 256} : std::vector<int>{128, 256, 384, 512};
    for (int b : {8, 16, 32, 64, 128}) {
      std::vector<double> leaves, nodes, ttfts;
      for (int len : lengths) {
        auto sched = Scheduler::Create(**model, bench.Options(b, N, len, 1), bench.pool_);
        if (!sched.ok()) return Failure("bench prefix: " + sched.status().ToString());
        std::vector<Request> reqs;
        for (int i = 0; i < N; ++i) {
          const int P = len * (i + 1) / (N + 1);
          std::vector<int32_t> p(bench.system_.begin(), bench.system_.begin() + P);
          auto suffix = bench.RandomTokens(static_cast<size_t>(len - P), (*model)->config().n_vocab);
          p.insert(p.end(), suffix.begin(), suffix.end());
          reqs.push_back(bench.Make(std::move(p), 16));
        }
        TRELLIS_RETURN_IF_ERROR(bench.Run(**sched, reqs).status());
        leaves.push_back((*sched)->metrics().tree.n_leaves);
        nodes.push_back((*sched)->metrics().tree.n_nodes);
        TRELLIS_ASSIGN_OR_RETURN(auto tc, bench.Ttft(0.75, len, b, std::max(1, o.reps / 2)));
        auto& [t, cached] = tc;
        ttfts.push_back(Median(t) * 1e3);
        Emit(o, {{"figure", "blocksize"}, {"B", b}, {"L", len}, {"leaves", leaves.back()}, {"nodes", nodes.back()},
                 {"ttft_ms", ttfts.back()}, {"cached_tokens", cached}});
      }
      csv << b << "," << Mean(leaves) << "," << Stddev(leaves) << "," << Mean(ttfts) << "," << Stddev(ttfts) << ","
          << Mean(nodes) << "," << Stddev(nodes) << "\n";
      char row[200];
      std::snprintf(row, sizeof row, "| %d | %.1f +- %.1f | %.1f +- %.1f | %.1f +- %.1f |\n", b, Mean(leaves), Stddev(leaves),
                    Mean(nodes), Stddev(nodes), Mean(ttfts), Stddev(ttfts));
      md += row;
      std::fprintf(stderr, "%s", row);
    }
  }

  std::ofstream(o.out_dir + (o.only.empty() ? "/prefix.md" : "/prefix-" + o.only + ".md")) << md;
  WritePlots(o.out_dir);
  if (!o.json) std::printf("%s", md.c_str());
  std::fprintf(stderr, "bench prefix: results in %s/ (throughput.csv, ttft.csv, blocksize.csv, prefix.md, *.png)\n",
               o.out_dir.c_str());
  return Status::Ok();
}

}  // namespace trellis::bench
