#include "bench/grid_predict.h"

#include <algorithm>
#include <memory>
#include <span>

#include <nlohmann/json.hpp>

#include "bench/report.h"
#include "engine/forward.h"
#include "engine/kv_layout.h"
#include "engine/model.h"
#include "kv/block_pool.h"
#include "model/gguf.h"
#include "util/clock.h"
#include "util/thread_pool.h"

namespace trellis::bench::grid_model {
namespace {

// One Forward over the first layers (and the output head), its own pool and threads.
class Harness {
 public:
  Harness(const Model& m, const GridEvalOptions& o, int max_seqs, int max_rows)
      : model_(m), threads_(o.node_threads), per_seq_((o.prompt + o.decode_tokens + 64) / kBlock + 2) {
    pool_ = std::move(BlockPool::Create(LocalKvLayoutFor(m, kBlock), per_seq_ * max_seqs)).value();
    fwd_ = std::make_unique<Forward>(m, pool_->view(), max_rows, max_seqs, threads_);
    tokens_.assign(static_cast<size_t>(max_rows), 100);
    for (int s = 0; s < max_seqs; ++s) {
      tables_.emplace_back();
      for (int b = 0; b < per_seq_; ++b) tables_.back().push_back(s * per_seq_ + b);
    }
    hidden_.assign(static_cast<size_t>(max_seqs) * m.config().n_embd, 0.01f);
  }
  // Seconds per layer of n_seqs sequences of n_tokens at pos0.
  double Layers(int n_seqs, int n_tokens, int pos0) {
    std::vector<SeqBatch> b;
    for (int s = 0; s < n_seqs; ++s) {
      b.push_back(SeqBatch{std::span<const int32_t>(tokens_.data(), static_cast<size_t>(n_tokens)), pos0,
                           tables_[static_cast<size_t>(s)], 0});
    }
    (void)fwd_->Prepare(b);
    const double t0 = NowSeconds();
    fwd_->RunLayers();
    return (NowSeconds() - t0) / model_.n_local_layers();
  }
  double Output(int rows) {
    std::vector<int32_t> nt(static_cast<size_t>(rows), 1), nl(static_cast<size_t>(rows), 1);
    const double t0 = NowSeconds();
    (void)fwd_->ComputeLogits(nt, nl, hidden_.data());
    return NowSeconds() - t0;
  }

 private:
  const Model& model_;
  ThreadPool threads_;
  int per_seq_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<Forward> fwd_;
  std::vector<int32_t> tokens_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<float> hidden_;
};

}  // namespace

// ---- the model's geometry -------------------------------------------------------------------

Result<Geometry> ReadGeometry(const std::string& path) {
  TRELLIS_ASSIGN_OR_RETURN(GgufFile g, GgufFile::Open(path));
  TRELLIS_ASSIGN_OR_RETURN(ModelConfig c, ModelConfig::FromGguf(g));
  Geometry geo;
  geo.n_layer = c.n_layer;
  geo.n_embd = c.n_embd;
  geo.n_vocab = c.n_vocab;
  geo.n_ctx = c.n_ctx_train;
  auto eos = g.GetUint("tokenizer.ggml.eos_token_id");
  geo.eos = eos.ok() ? static_cast<int>(*eos) : -1;
  bool tied = true;
  for (const GgufTensorInfo& t : g.tensors()) {
    const double b = static_cast<double>(t.size_bytes);
    if (t.name.rfind("blk.", 0) == 0) {
      geo.layer_bytes += b / c.n_layer;
    } else if (t.name == "output.weight") {
      geo.output_bytes += b;
      tied = false;
    } else if (t.name == "output_norm.weight") {
      geo.output_bytes += b;
    } else if (t.name == "token_embd.weight") {
      geo.embd_bytes += b;
    }
  }
  if (tied) geo.output_bytes += geo.embd_bytes;
  geo.kv_layer_block_bytes = 2.0 * 2 * c.n_head_kv * kBlock * c.head_dim;
  return geo;
}

// Layers per process: [0] is the head's (or the whole model's, for one process).
std::vector<int> Split(const Geometry& g, int n) {
  if (n == 1) return {g.n_layer};
  std::vector<int> best;
  double best_max = 1e300;
  for (int h = 0; h < g.n_layer - (n - 1) + 1; ++h) {
    const int rest = g.n_layer - h;
    if (rest < n - 1) continue;
    std::vector<int> s = {h};
    for (int i = 0; i < n - 1; ++i) s.push_back(rest / (n - 1) + (i < rest % (n - 1) ? 1 : 0));
    double worst = h * g.layer_bytes + g.output_bytes;
    for (int i = 1; i < n; ++i) worst = std::max(worst, s[static_cast<size_t>(i)] * g.layer_bytes);
    if (worst < best_max) best_max = worst, best = s;
  }
  return best;
}

// ---- the parts' times, measured here ----------------------------------------------------------

// Every layer, not a few: a few layers' weights would partly stay in the CPU's caches
// between runs, which the real runs' whole model never does.
Result<Parts> MeasureParts(const GridEvalOptions& o, const Geometry& g, const std::vector<int>& rows) {
  TRELLIS_ASSIGN_OR_RETURN(auto model, Model::Load(o.model));
  const int max_seqs = *std::max_element(rows.begin(), rows.end());
  const int max_rows = std::max(o.prompt, max_seqs);
  Harness a(*model, o, max_seqs, max_rows), b(*model, o, max_seqs, max_rows);
  const int ctx = 16 + o.decode_tokens / 2;  // the mean context of a decode run
  Parts p;
  for (int busy = 0; busy < 2; ++busy) {
    // The other core runs the same mix meanwhile (busy), or nothing.
    std::atomic<bool> stop{false};
    std::thread other;
    if (busy) {
      other = std::thread([&] {
        for (int k = 0; !stop; ++k) {
          (void)b.Layers(rows[static_cast<size_t>(k) % rows.size()], 1, ctx);
          if (k % 4 == 0) (void)b.Output(rows.back());
        }
      });
    }
    for (int r : rows) {
      std::vector<double> v, out;
      for (int k = 0; k < 7; ++k) v.push_back(a.Layers(r, 1, ctx + k));
      for (int k = 0; k < 7; ++k) out.push_back(a.Output(r));
      (busy ? p.layer_busy : p.layer)[r] = Median(v);
      (busy ? p.output_busy : p.output)[r] = Median(out);
    }
    std::vector<double> chunks;
    for (int pos = 0; pos + o.chunk <= o.prompt; pos += o.chunk) chunks.push_back(a.Layers(1, o.chunk, pos));
    (busy ? p.prefill_layer_chunk_busy : p.prefill_layer_chunk) = Mean(chunks);
    if (!busy) p.prefill_layer_whole = a.Layers(1, o.prompt, 0);
    stop = true;
    if (other.joinable()) other.join();
  }
  return p;
}

// See the file comment. layers[0] is the head's; cores bounds how many stages run at once;
// `shared` says the stages share this machine (their parts' busy times apply).
Prediction Predict(const GridEvalOptions& o, const Geometry& g, const Parts& parts, const std::vector<int>& layers,
                   double rtt, double bw, double cores, bool shared) {
  Prediction pr;
  const size_t n = layers.size();
  Parts p = parts;
  if (shared && n > 1) {
    p.layer = parts.layer_busy;
    p.output = parts.output_busy;
    p.prefill_layer_chunk = parts.prefill_layer_chunk_busy;
  }
  auto interp = [](const std::map<int, double>& m, int r) {
    auto it = m.lower_bound(r);
    if (it == m.end()) return std::prev(it)->second;
    if (it->first == r || it == m.begin()) return it->second;
    auto lo = std::prev(it);
    return lo->second + (it->second - lo->second) * (r - lo->first) / (it->first - lo->first);
  };
  auto hops = [&](double rows) { return static_cast<double>(n - 1) * (rtt + 2 * rows * g.n_embd * 4 / bw); };
  auto stages = [&](int r) {
    std::vector<double> s;
    for (size_t i = 0; i < n; ++i) s.push_back(layers[i] * interp(p.layer, r) + (i == 0 ? interp(p.output, r) : 0));
    return s;
  };
  auto sum = [](const std::vector<double>& v) { double t = 0; for (double x : v) t += x; return t; };
  auto max = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const int G = n == 1 ? 1 : o.depth;
  {
    const auto s = stages(1);
    pr.decode1 = 1.0 / (sum(s) + hops(1));
  }
  {
    const int r = (o.sessions + G - 1) / G;
    const auto s = stages(r);
    const double loop = sum(s) + hops(r);
    const double period = std::max({loop, G * max(s), G * sum(s) / cores});
    pr.decode_s = o.sessions / period;
  }
  const double out1 = interp(p.output, 1);
  if (n == 1) {
    pr.ttft = g.n_layer * p.prefill_layer_whole + out1;
  } else {
    // The chunks the scheduler cuts (scheduler.cc: what is left in four or more, at most
    // --chunk, at least 16, none of fewer than 16 left at the end), each stage's time per chunk from a per-layer cost a + b x c
    // (a: the one-row time, b from the measured --chunk chunk), through the stages in
    // order (a flow shop), and never faster than the cores allow.
    const double a = interp(p.layer, 1);
    const double b = std::max(0.0, (p.prefill_layer_chunk - a) / o.chunk);
    std::vector<int> chunks;
    for (int rem = o.prompt; rem > 0;) {
      int c = std::min({o.chunk, std::max(16, (rem + 3) / 4), rem});
      if (rem - c < 16) c = std::min(o.chunk, rem);
      chunks.push_back(c);
      rem -= c;
    }
    std::vector<double> done(n, 0.0);
    double work = 0;
    for (int c : chunks) {
      double t = 0;
      for (size_t i = 0; i < n; ++i) {
        const double stage = layers[i] * (a + b * c);
        work += stage;
        t = std::max(t, done[i]) + stage + (i + 1 < n ? rtt + 2.0 * c * g.n_embd * 4 / bw : 0);
        done[i] = t;
      }
    }
    pr.ttft = std::max(done[n - 1], work / cores) + out1;
  }
  return pr;
}

}  // namespace trellis::bench::grid_model
