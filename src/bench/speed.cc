#include "bench/speed.h"

#include <algorithm>
#include <memory>
#include <random>
#include <span>

#include <fmt/core.h>

#include "engine/forward.h"
#include "engine/kv_layout.h"
#include "engine/sampler.h"
#include "kv/block_pool.h"
#include "util/clock.h"
#include "util/thread_pool.h"

namespace trellis::bench {

Result<SpeedRuns> MeasureSpeed(const Model& model, const SpeedParams& p) {
  const ModelConfig& c = model.config();
  if (!model.whole()) return InvalidArgument("the speed benchmark runs a whole model, not a part of one");
  if (p.threads < 1 || p.threads > 256) return InvalidArgument(fmt::format("--threads {} out of range (1..256)", p.threads));
  TRELLIS_RETURN_IF_ERROR(CheckBlockSize(c, p.block_size));
  TRELLIS_RETURN_IF_ERROR(CheckKvTypes(c, p.kv_type_k, p.kv_type_v));
  if (p.pp < 0 || p.tg < 0 || p.depth < 0 || p.reps < 1 || p.sessions < 1) {
    return InvalidArgument("bench speed: -p, -n, -d must be >= 0; -r and -s >= 1");
  }
  if (int64_t{p.depth} + p.pp + p.tg > (int64_t{1} << 24)) {
    return InvalidArgument("bench speed: depth + prompt + generated tokens over 16M positions");
  }
  const int bs = p.block_size, d = p.depth;
  const int n_ctx = d + p.pp + p.tg + bs;
  const int max_batch = std::max({p.pp, p.sessions, d > 0 ? std::min(d, 512) : 1, 1});
  const int n_blocks = (d + p.pp + p.tg + bs - 1) / bs;            // the single sequence
  const int per_session = (p.tg + bs - 1) / bs;                     // each batched sequence
  const int batched = p.sessions > 1 ? p.sessions : 0;
  const int64_t total = int64_t{n_blocks} + int64_t{batched} * per_session + 1;
  if (total > (int64_t{1} << 30)) return InvalidArgument("KV pool too large");

  ThreadPool threads(p.threads);
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> pool, BlockPool::Create(KvLayoutFor(c, bs, p.kv_type_k, p.kv_type_v), static_cast<int32_t>(total)));
  Forward fwd(model, pool->view(), max_batch, std::max(p.sessions, 1), threads, n_ctx);

  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> tok(3, c.n_vocab - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(p.pp)), context(static_cast<size_t>(d));
  for (auto& t : prompt) t = tok(rng);
  for (auto& t : context) t = tok(rng);

  // The pool holds exactly these blocks, and lives only as long as this call: no release.
  std::vector<int32_t> table;
  for (int i = 0; i < n_blocks; ++i) table.push_back(pool->Allocate());
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batched));
  for (auto& t : tables) {
    for (int i = 0; i < per_session; ++i) t.push_back(pool->Allocate());
  }

  // The depth: positions [0, d) computed once, untimed, in chunks; every pp and tg test
  // then runs after them (attending to them) and overwrites only positions >= d.
  for (int pos = 0; pos < d;) {
    const int n = std::min(d - pos, max_batch);
    SeqBatch sb;
    sb.tokens = std::span<const int32_t>(context.data() + pos, static_cast<size_t>(n));
    sb.pos0 = pos;
    sb.block_table = table;
    sb.n_logits = 1;
    TRELLIS_RETURN_IF_ERROR(fwd.Run(std::span<const SeqBatch>(&sb, 1)));
    pos += n;
  }

  auto run_pp = [&]() -> Result<double> {
    SeqBatch sb;
    sb.tokens = prompt;
    sb.pos0 = d;
    sb.block_table = table;
    sb.n_logits = 1;
    const double t0 = NowSeconds();
    TRELLIS_RETURN_IF_ERROR(fwd.Run(std::span<const SeqBatch>(&sb, 1)));
    return p.pp / (NowSeconds() - t0);
  };
  auto run_tg = [&]() -> Result<double> {
    int32_t t = 1;
    const double t0 = NowSeconds();
    for (int i = 0; i < p.tg; ++i) {
      SeqBatch sb;
      sb.tokens = std::span<const int32_t>(&t, 1);
      sb.pos0 = d + i;
      sb.block_table = table;
      sb.n_logits = 1;
      TRELLIS_RETURN_IF_ERROR(fwd.Run(std::span<const SeqBatch>(&sb, 1)));
      t = Sampler::Greedy({fwd.logits_row(0), static_cast<size_t>(c.n_vocab)});
    }
    return p.tg / (NowSeconds() - t0);
  };
  // Batched decode: `sessions` sequences, each with its own blocks, one token each per step.
  auto run_batched = [&]() -> Result<double> {
    std::vector<int32_t> toks(tables.size(), 1);
    std::vector<SeqBatch> batch(tables.size());
    const double t0 = NowSeconds();
    for (int i = 0; i < p.tg; ++i) {
      for (size_t s = 0; s < tables.size(); ++s) {
        batch[s].tokens = std::span<const int32_t>(&toks[s], 1);
        batch[s].pos0 = i;
        batch[s].block_table = tables[s];
        batch[s].n_logits = 1;
      }
      TRELLIS_RETURN_IF_ERROR(fwd.Run(batch));
      for (size_t s = 0; s < tables.size(); ++s) {
        toks[s] = Sampler::Greedy({fwd.logits_row(static_cast<int>(s)), static_cast<size_t>(c.n_vocab)});
      }
    }
    return static_cast<double>(p.tg) * static_cast<double>(tables.size()) / (NowSeconds() - t0);
  };

  if (p.tg > 0) TRELLIS_RETURN_IF_ERROR(run_tg().status());  // warm-up
  SpeedRuns r;
  auto profiled = [&](ForwardProfile& prof, auto&& run) -> Result<double> {
    if (p.profile) fwd.set_profile(&prof);
    Result<double> v = run();
    fwd.set_profile(nullptr);
    return v;
  };
  for (int rep = 0; rep < p.reps; ++rep) {
    if (!tables.empty() && p.tg > 0) {
      TRELLIS_ASSIGN_OR_RETURN(double v, profiled(r.tg_batched_profile, run_batched));
      r.tg_batched.push_back(v);
    }
    if (p.pp > 0) {
      TRELLIS_ASSIGN_OR_RETURN(double v, profiled(r.pp_profile, run_pp));
      r.pp.push_back(v);
    }
    if (p.tg > 0) {
      TRELLIS_ASSIGN_OR_RETURN(double v, profiled(r.tg_profile, run_tg));
      r.tg.push_back(v);
    }
  }
  return r;
}

}  // namespace trellis::bench
