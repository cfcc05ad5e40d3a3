#include "engine/forward.h"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

#include "engine/moe.h"
#include "kernels/matmul.h"
#include "util/clock.h"

namespace trellis {

Forward::Forward(const Model& model, const PagedKv& kv, int max_batch_tokens, int max_logit_rows,
                 ThreadPool& pool, int n_ctx)
    : model_(model), kv_(kv), pool_(pool), max_tokens_(std::max(1, max_batch_tokens)),
      max_logit_rows_(std::max(1, max_logit_rows)),
      n_vocab_(static_cast<size_t>(model.config().n_vocab)) {
  const ModelConfig& c = model.config();
  const size_t T = static_cast<size_t>(max_tokens_);
  const size_t L = static_cast<size_t>(max_logit_rows_);
  const size_t q_dim = static_cast<size_t>(c.n_head * c.head_dim);
  x_.resize(T * c.n_embd);
  xn_.resize(T * c.n_embd);
  q_.resize(T * q_dim);
  k_.resize(T * c.kv_dim());
  v_.resize(T * c.kv_dim());
  attn_.resize(T * q_dim);
  tmp_.resize(T * c.n_embd);
  const size_t ff = static_cast<size_t>(std::max({c.n_ff, c.n_ff_exp, c.n_ff_shexp}));
  gate_.resize(T * ff);
  up_.resize(T * ff);
  if (c.moe()) {
    const size_t NE = static_cast<size_t>(c.n_expert), K = static_cast<size_t>(c.n_expert_used);
    router_.resize(T * NE);
    exp_ids_.resize(T * K);
    exp_w_.resize(T * K);
    exp_count_.resize(NE + 1);
    exp_slots_.resize(T * K);
    route_scratch_.resize(NE);
    shexp_gate_.resize(T);
    xe_.resize(T * c.n_embd);
    de_.resize(T * c.n_embd);
  }
  pos_.resize(T);
  out_in_.resize(L * c.n_embd);
  logits_.resize(L * n_vocab_);
  attn_seqs_.reserve(T);

  size_t scratch = 0;
  auto need = [&](const WeightMatrix& w, int64_t rows) {
    scratch = std::max(scratch, MatMulScratchBytes(w.type, w.cols, rows));
  };
  if (model.part().head) need(model.output(), static_cast<int64_t>(L));
  for (int i = model.part().first_layer; i < model.part().last_layer; ++i) {
    const LayerWeights& l = model.layer(i);
    for (const WeightMatrix* w : l.Matrices()) {
      if (w->rows > 0) need(*w, max_tokens_);
    }
  }
  scratch_raw_.resize(scratch + 64);
  scratch_ = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch_raw_.data()) + 63) & ~uintptr_t{63});
  attn_scratch_.resize(AttentionScratchFloats(pool.size(), c.head_dim, kv.layout.block_size));

  rope_.n_dims = c.n_rot;
  rope_.freq_base = c.rope_freq_base;
  rope_.freq_scale = c.rope_freq_scale;
  rope_.freq_factors = model.RopeFactors(n_ctx > 0 ? n_ctx : c.DefaultContext());
  rope_.neox = c.rope_neox;
  rope_.attn_factor = c.rope_attn_factor;
  if (c.rope_yarn_ext_factor != 0.0f) {
    rope_.ext_factor = c.rope_yarn_ext_factor;
    RopeYarnCorrDims(c.n_rot, c.n_ctx_orig, c.rope_freq_base, c.rope_yarn_beta_fast, c.rope_yarn_beta_slow, rope_.corr_dims);
  }
  rot_k_ = KvRotationK(kv.layout);
  rot_v_ = KvRotationV(kv.layout);
  // Sliding-window layers (Gemma): their own base, no frequency scaling.
  rope_swa_ = rope_;
  rope_swa_.freq_base = c.rope_freq_base_swa;
  rope_swa_.freq_scale = 1.0f;
  rope_cs_.resize(static_cast<size_t>(T) * static_cast<size_t>(c.n_rot));
  if (c.n_swa > 0) rope_swa_cs_.resize(rope_cs_.size());
}

namespace {
// Element-wise work below this many floats runs on the calling thread: a fork/join
// costs more than it saves (decode rows are a few thousand floats).
constexpr int64_t kMinParallelFloats = 1 << 16;
}  // namespace

template <class Fn>
void Forward::ForRange(int64_t n, int64_t floats, Fn&& fn) {
  if (floats < kMinParallelFloats) {
    fn(int64_t{0}, n, 0);
  } else {
    pool_.ParallelFor(n, fn);
  }
}

void Forward::RowsRmsNorm(const float* in, const std::vector<float>& w, float* out, int n_rows) {
  const int64_t n = model_.config().n_embd;
  const float eps = model_.config().rms_eps;
  auto rows = [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) RmsNorm(in + r * n, w.data(), n, eps, out + r * n);
  };
  ForRange(n_rows, n_rows * n, rows);
}

void Forward::AddBias(float* x, int64_t width, const std::vector<float>& b, int n_rows) {
  if (b.empty()) return;
  for (int r = 0; r < n_rows; ++r) {
    float* row = x + r * width;
    for (int64_t i = 0; i < width; ++i) row[i] += b[static_cast<size_t>(i)];
  }
}

void Forward::HeadsRmsNorm(float* x, int64_t width, const std::vector<float>& w, int n_heads, int n_rows) {
  const int D = model_.config().head_dim;
  const float eps = model_.config().rms_eps;
  auto rows = [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      for (int h = 0; h < n_heads; ++h) {
        float* head = x + r * width + static_cast<int64_t>(h) * D;
        RmsNorm(head, w.data(), D, eps, head);
      }
    }
  };
  ForRange(n_rows, static_cast<int64_t>(n_rows) * width, rows);
}

void Forward::AddInPlace(float* x, const float* y, int64_t n) {
  auto add = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) x[i] += y[i];
  };
  ForRange(n, n, add);
}

const char* ForwardProfile::Name(int phase) {
  static constexpr const char* kNames[kPhases] = {
      "embeddings, plan", "norms", "q/k/v products", "biases, q/k norms, rope", "K/V write", "attention",
      "output projection", "residual adds", "gate/up products", "SwiGLU / GeGLU", "down product",
      "expert routing, gather, scatter", "logits"};
  return phase >= 0 && phase < kPhases ? kNames[phase] : "?";
}

int64_t ForwardProfile::TotalNs() const {
  int64_t ns = 0;
  for (const Counts& c : phase) ns += c.ns;
  return ns;
}

void Forward::Mark(ForwardProfile::Phase p) {
  if (profile_ == nullptr) return;
  const int64_t now = NowNanos();
  profile_->phase[p].ns += now - mark_ns_;
  mark_ns_ = now;
}

void Forward::CountMatMul(ForwardProfile::Phase p, const WeightMatrix& w, int64_t n) {
  if (profile_ == nullptr) return;
  ForwardProfile::Counts& c = profile_->phase[p];
  const bool float_weights = w.type == GgmlType::kF32 || w.type == GgmlType::kF16 || w.type == GgmlType::kBF16;
  (float_weights ? c.float_macs : c.macs) += static_cast<double>(w.rows) * static_cast<double>(w.cols) * static_cast<double>(n);
  c.weight_bytes += static_cast<double>(w.rows) * static_cast<double>(w.row_bytes);
  SetActivationTimer(&c.act_ns);
}

Status Forward::Run(std::span<const SeqBatch> seqs) {
  TRELLIS_CHECK(model_.whole());
  // The matmuls' activation timer points into the profile only while this pass runs.
  struct TimerOff {
    bool on;
    ~TimerOff() {
      if (on) SetActivationTimer(nullptr);
    }
  } timer_off{profile_ != nullptr};
  if (profile_ != nullptr) mark_ns_ = NowNanos();
  TRELLIS_RETURN_IF_ERROR(Prepare(seqs));
  Mark(ForwardProfile::kEmbed);
  if (profile_ != nullptr) {
    ++profile_->passes;
    profile_->tokens += n_rows_;
  }
  RunLayers();
  if (n_logit_rows_ == 0) return Status::Ok();
  // Gather the rows that want logits, norm them, project to the vocabulary. attn_seqs_
  // holds the non-empty sequences in batch order; tmp_ has room for n_logits <= n_rows.
  const int64_t E = model_.config().n_embd;
  int out_row = 0;
  size_t si = 0;
  for (const SeqBatch& sb : seqs) {
    if (sb.tokens.empty()) continue;
    const AttnSeq& a = attn_seqs_[si++];
    for (int i = a.n_tokens - sb.n_logits; i < a.n_tokens; ++i) {
      std::copy_n(x_.data() + static_cast<int64_t>(a.q_row0 + i) * E, E, tmp_.data() + static_cast<int64_t>(out_row++) * E);
    }
  }
  ProjectLogits(n_logit_rows_);
  Mark(ForwardProfile::kLogits);
  return Status::Ok();
}

Status Forward::Prepare(std::span<const SeqBatch> seqs, const float* hidden_in) {
  const ModelConfig& c = model_.config();
  const int bs = kv_.layout.block_size;

  // Plan: validate everything before touching the KV cache.
  int n_rows = 0;
  int n_logits = 0;
  n_rows_ = 0;
  n_logit_rows_ = 0;
  attn_seqs_.clear();
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqBatch& sb = seqs[s];
    const int n = static_cast<int>(sb.tokens.size());
    if (n == 0) continue;
    if (sb.pos0 < 0) return InvalidArgument(fmt::format("sequence {}: negative position {}", s, sb.pos0));
    if (n_rows + n > max_tokens_) {
      return InvalidArgument(fmt::format("batch of {}+ tokens exceeds the maximum of {}", n_rows + n, max_tokens_));
    }
    const int64_t end = static_cast<int64_t>(sb.pos0) + n;
    if (static_cast<int64_t>(sb.block_table.size()) * bs < end) {
      return InvalidArgument(fmt::format("sequence {}: block table covers {} positions, {} needed", s,
                                         sb.block_table.size() * static_cast<size_t>(bs), end));
    }
    if (hidden_in == nullptr) {
      for (int32_t t : sb.tokens) {
        if (t < 0 || t >= c.n_vocab) return InvalidArgument(fmt::format("token id {} is outside the vocabulary (0..{})", t, c.n_vocab - 1));
      }
    }
    if (sb.n_logits < 0 || sb.n_logits > n) return InvalidArgument(fmt::format("sequence {}: n_logits {} of {} tokens", s, sb.n_logits, n));
    n_logits += sb.n_logits;
    if (n_logits > max_logit_rows_) {
      return InvalidArgument(fmt::format("{} logit rows requested, at most {}", n_logits, max_logit_rows_));
    }
    attn_seqs_.push_back(AttnSeq{sb.block_table.data(), sb.pos0, n, n_rows});
    for (int i = 0; i < n; ++i) pos_[static_cast<size_t>(n_rows + i)] = sb.pos0 + i;
    n_rows += n;
  }
  const int64_t E = c.n_embd;
  if (hidden_in != nullptr) {
    std::copy_n(hidden_in, static_cast<int64_t>(n_rows) * E, x_.data());
  } else if (n_rows > 0) {
    if (!model_.part().embed) return Internal("this part of the model has no token embeddings");
    // x = embd[token]
    int r = 0;
    for (const SeqBatch& sb : seqs) {
      for (int32_t t : sb.tokens) GetRow(model_.token_embd(), t, x_.data() + static_cast<int64_t>(r++) * E);
    }
    if (c.embd_scale > 0) {  // Gemma: x *= sqrt(n_embd)
      for (int64_t i = 0; i < static_cast<int64_t>(n_rows) * E; ++i) x_[static_cast<size_t>(i)] *= c.embd_scale;
    }
  }
  n_rows_ = n_rows;
  n_logit_rows_ = n_logits;
  return Status::Ok();
}

void Forward::RunLayers() {
  const ModelConfig& c = model_.config();
  const int n_rows = n_rows_;
  if (n_rows == 0) return;
  const int64_t E = c.n_embd;
  const int64_t QD = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t KD = c.kv_dim();
  const float scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const int first = model_.part().first_layer;

  if (profile_ != nullptr) profile_->layer_passes += model_.part().last_layer - first;
  // Every layer rotates Q and K at the same positions: their cos and sin once per pass
  // (a 512-token prompt computed them 2 x 22 times, 2 % of its time; bench speed --budget).
  const int64_t n_dims = c.n_rot;
  ForRange(n_rows, static_cast<int64_t>(n_rows) * n_dims * 32, [&](int64_t b, int64_t e, int) {
    RopeTables(pos_.data() + b, e - b, rope_, rope_cs_.data() + b * n_dims);
    if (!rope_swa_cs_.empty()) RopeTables(pos_.data() + b, e - b, rope_swa_, rope_swa_cs_.data() + b * n_dims);
  });
  Mark(ForwardProfile::kRope);
  for (int li = first; li < model_.part().last_layer; ++li) {
    const LayerWeights& l = model_.layer(li);
    const int kv_layer = li - first;  // the pool holds this part's layers only
    const bool swa = c.IsSwaLayer(li);
    const RopeParams& rope = swa ? rope_swa_ : rope_;
    const float* rope_cs = swa ? rope_swa_cs_.data() : rope_cs_.data();
    const AttnOptions attn_opt{c.attn_softcap, swa ? c.n_swa : 0};
    // Attention block.
    RowsRmsNorm(x_.data(), l.attn_norm, xn_.data(), n_rows);
    Mark(ForwardProfile::kNorm);
    const MatMulOut qkv[] = {{&l.wq, q_.data(), QD}, {&l.wk, k_.data(), KD}, {&l.wv, v_.data(), KD}};
    for (const MatMulOut& o : qkv) CountMatMul(ForwardProfile::kQkv, *o.w, n_rows);
    MatMulShared(qkv, xn_.data(), E, n_rows, pool_, scratch_);
    Mark(ForwardProfile::kQkv);
    AddBias(q_.data(), QD, l.bq, n_rows);
    AddBias(k_.data(), KD, l.bk, n_rows);
    AddBias(v_.data(), KD, l.bv, n_rows);
    if (c.qk_norm) {
      HeadsRmsNorm(q_.data(), QD, l.q_norm, c.n_head, n_rows);
      HeadsRmsNorm(k_.data(), KD, l.k_norm, c.n_head_kv, n_rows);
    }
    ForRange(n_rows, static_cast<int64_t>(n_rows) * (QD + KD), [&](int64_t b, int64_t e, int) {
      RopeApply(q_.data() + b * QD, QD, e - b, rope_cs + b * n_dims, c.n_head, c.head_dim, rope);
      RopeApply(k_.data() + b * KD, KD, e - b, rope_cs + b * n_dims, c.n_head_kv, c.head_dim, rope);
    });
    Mark(ForwardProfile::kRope);
    // Rotations and the K/V write go row by row over the pool's threads (each row's work is
    // what it was on one thread, so the bytes written are the same): for a quantized cache
    // on a narrow model they were ~5% of a prefill's CPU time on one core while the other
    // waited.
    ForRange(n_rows, static_cast<int64_t>(n_rows) * (QD + 2 * KD), [&](int64_t b, int64_t e, int) {
      const int64_t n = e - b;
      if (rot_k_ > 0) {  // a quantized K: Q and K rotated alike (KvRotationK)
        HadamardRows(q_.data() + b * QD, QD, n, QD, rot_k_);
        HadamardRows(k_.data() + b * KD, KD, n, KD, rot_k_);
      }
      if (rot_v_ > 0) HadamardRows(v_.data() + b * KD, KD, n, KD, rot_v_);
      // The sequences' rows in [b, e), as sequences of their own.
      thread_local std::vector<AttnSeq> part;
      part.clear();
      for (const AttnSeq& s : attn_seqs_) {
        const int64_t lo = std::max<int64_t>(b, s.q_row0), hi = std::min<int64_t>(e, s.q_row0 + s.n_tokens);
        if (lo >= hi) continue;
        part.push_back({s.block_table, static_cast<int32_t>(s.pos0 + (lo - s.q_row0)), static_cast<int32_t>(hi - lo),
                        static_cast<int32_t>(lo)});
      }
      KvWrite(kv_, kv_layer, part, k_.data(), KD, v_.data(), KD);
    });
    Mark(ForwardProfile::kKvWrite);
    PagedAttention(kv_, kv_layer, attn_seqs_, q_.data(), QD, c.n_head, scale, attn_.data(), QD, pool_,
                   attn_scratch_.data(), attn_opt);
    if (profile_ != nullptr) {  // QK and PV: 2 x 2 FLOPs per head dimension and context position
      double ctx = 0;
      for (const AttnSeq& s : attn_seqs_) {
        for (int i = 0; i < s.n_tokens; ++i) {
          const int64_t n = int64_t{s.pos0} + i + 1;
          ctx += static_cast<double>(attn_opt.window > 0 ? std::min<int64_t>(n, attn_opt.window) : n);
        }
      }
      profile_->phase[ForwardProfile::kAttention].flops += 4.0 * static_cast<double>(QD) * ctx;
    }
    if (rot_v_ > 0) {  // back from V's rotation
      ForRange(n_rows, static_cast<int64_t>(n_rows) * QD, [&](int64_t b, int64_t e, int) {
        HadamardRows(attn_.data() + b * QD, QD, e - b, QD, rot_v_);
      });
    }
    Mark(ForwardProfile::kAttention);
    CountMatMul(ForwardProfile::kOut, l.wo, n_rows);
    MatMul(l.wo, attn_.data(), QD, n_rows, tmp_.data(), E, pool_, scratch_);
    Mark(ForwardProfile::kOut);
    if (c.post_norms) RowsRmsNorm(tmp_.data(), l.attn_post_norm, tmp_.data(), n_rows);
    Mark(ForwardProfile::kNorm);
    AddInPlace(x_.data(), tmp_.data(), n_rows * E);
    Mark(ForwardProfile::kResidual);

    // Feed-forward block.
    RowsRmsNorm(x_.data(), l.ffn_norm, xn_.data(), n_rows);
    Mark(ForwardProfile::kNorm);
    if (c.moe()) {
      MoeFfn(l, n_rows);
    } else {
      GatedFfn(l.w_gate, l.w_up, l.w_down, xn_.data(), n_rows, tmp_.data());
    }
    if (c.post_norms) RowsRmsNorm(tmp_.data(), l.ffn_post_norm, tmp_.data(), n_rows);
    Mark(ForwardProfile::kNorm);
    AddInPlace(x_.data(), tmp_.data(), n_rows * E);
    Mark(ForwardProfile::kResidual);
  }
}

void Forward::GatedFfn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down, const float* x,
                       int n_rows, float* out) {
  const ModelConfig& c = model_.config();
  const int64_t E = c.n_embd, F = gate.rows;
  const MatMulOut gate_up[] = {{&gate, gate_.data(), F}, {&up, up_.data(), F}};
  CountMatMul(ForwardProfile::kFfnIn, gate, n_rows);
  CountMatMul(ForwardProfile::kFfnIn, up, n_rows);
  MatMulShared(gate_up, x, E, n_rows, pool_, scratch_);
  Mark(ForwardProfile::kFfnIn);
  const int64_t total = static_cast<int64_t>(n_rows) * F;
  ForRange(total, total, [&](int64_t b, int64_t e, int) {
    if (c.ffn_gelu) {
      GeGlu(gate_.data() + b, up_.data() + b, gate_.data() + b, e - b);
    } else {
      SwiGlu(gate_.data() + b, up_.data() + b, gate_.data() + b, e - b);
    }
  });
  Mark(ForwardProfile::kFfnAct);
  CountMatMul(ForwardProfile::kFfnDown, down, n_rows);
  MatMul(down, gate_.data(), F, n_rows, out, E, pool_, scratch_);
  Mark(ForwardProfile::kFfnDown);
}

void Forward::MoeFfn(const LayerWeights& l, int n_rows) {
  const ModelConfig& c = model_.config();
  const int NE = c.n_expert, K = c.n_expert_used;
  const int64_t E = c.n_embd;
  // Route: logits in f32 (the router is kept f32 in GGUF files), then each row's choice.
  CountMatMul(ForwardProfile::kRouting, l.router, n_rows);
  MatMul(l.router, xn_.data(), E, n_rows, router_.data(), NE, pool_, scratch_);
  const ExpertRouting routing = ExpertRouting::Of(c);
  std::fill(exp_count_.begin(), exp_count_.end(), 0);
  for (int r = 0; r < n_rows; ++r) {
    int32_t* ids = exp_ids_.data() + static_cast<ptrdiff_t>(r) * K;
    RouteExperts(router_.data() + static_cast<ptrdiff_t>(r) * NE, NE, routing, ids,
                 exp_w_.data() + static_cast<ptrdiff_t>(r) * K, route_scratch_.data());
    for (int j = 0; j < K; ++j) ++exp_count_[static_cast<size_t>(ids[j]) + 1];
  }
  // Group (a counting sort, so each expert's rows stay in batch order): exp_count_[e + 1]
  // holds expert e's row count; the prefix sum makes exp_count_[e] e's start; placing the
  // slots moves each start to its expert's end; shifting by one gives the starts back.
  for (int e = 0; e < NE; ++e) exp_count_[static_cast<size_t>(e) + 1] += exp_count_[static_cast<size_t>(e)];
  for (int slot = 0; slot < n_rows * K; ++slot) {
    int32_t& at = exp_count_[static_cast<size_t>(exp_ids_[static_cast<size_t>(slot)])];
    exp_slots_[static_cast<size_t>(at++)] = slot;
  }
  for (int e = NE; e > 0; --e) exp_count_[static_cast<size_t>(e)] = exp_count_[static_cast<size_t>(e) - 1];
  exp_count_[0] = 0;
  std::fill_n(tmp_.data(), static_cast<int64_t>(n_rows) * E, 0.0f);
  // Each row sums its experts in expert order whatever the batch holds, so a row's result
  // does not depend on the rows batched with it.
  for (int e = 0; e < NE; ++e) {
    const int32_t begin = exp_count_[static_cast<size_t>(e)], n = exp_count_[static_cast<size_t>(e) + 1] - begin;
    if (n == 0) continue;
    const int32_t* slots = exp_slots_.data() + begin;
    auto gather = [&](int64_t b, int64_t end, int) {
      for (int64_t i = b; i < end; ++i) std::copy_n(xn_.data() + (slots[i] / K) * E, E, xe_.data() + i * E);
    };
    ForRange(n, n * E, gather);
    Mark(ForwardProfile::kRouting);
    const size_t ex = static_cast<size_t>(e);
    GatedFfn(l.exp_gate[ex], l.exp_up[ex], l.exp_down[ex], xe_.data(), n, de_.data());
    // Scatter: a row appears at most once among an expert's slots, so rows do not race.
    auto scatter = [&](int64_t b, int64_t end, int) {
      for (int64_t i = b; i < end; ++i) {
        const float w = exp_w_[static_cast<size_t>(slots[i])];
        float* out = tmp_.data() + (slots[i] / K) * E;
        const float* d = de_.data() + i * E;
        for (int64_t j = 0; j < E; ++j) out[j] += w * d[j];
      }
    };
    ForRange(n, n * E, scatter);
    Mark(ForwardProfile::kRouting);
  }
  if (c.n_ff_shexp > 0) SharedExpert(l, n_rows);
  Mark(ForwardProfile::kRouting);
}

void Forward::SharedExpert(const LayerWeights& l, int n_rows) {
  const ModelConfig& c = model_.config();
  const int64_t E = c.n_embd;
  CountMatMul(ForwardProfile::kRouting, l.shexp_gate_inp, n_rows);
  MatMul(l.shexp_gate_inp, xn_.data(), E, n_rows, shexp_gate_.data(), 1, pool_, scratch_);
  Mark(ForwardProfile::kRouting);
  GatedFfn(l.shexp_gate, l.shexp_up, l.shexp_down, xn_.data(), n_rows, de_.data());
  for (int r = 0; r < n_rows; ++r) {
    // llama.cpp computes the sigmoid as silu(g) / g; the same value away from g = 0.
    const float g = 1.0f / (1.0f + std::exp(-shexp_gate_[static_cast<size_t>(r)]));
    float* out = tmp_.data() + static_cast<int64_t>(r) * E;
    const float* d = de_.data() + static_cast<int64_t>(r) * E;
    for (int64_t j = 0; j < E; ++j) out[j] += g * d[j];
  }
}

Status Forward::ComputeLogits(std::span<const int32_t> n_tokens, std::span<const int32_t> n_logits, const float* hidden) {
  if (!model_.part().head) return Internal("this part of the model has no output head");
  if (n_tokens.size() != n_logits.size()) return InvalidArgument("n_tokens and n_logits differ in length");
  const int64_t E = model_.config().n_embd;
  int64_t row = 0;
  int out_row = 0;
  for (size_t s = 0; s < n_tokens.size(); ++s) {
    const int32_t n = n_tokens[s], k = n_logits[s];
    if (n < 0 || k < 0 || k > n) return InvalidArgument(fmt::format("sequence {}: n_logits {} of {} tokens", s, k, n));
    if (row + n > max_tokens_ || out_row + k > max_logit_rows_) return InvalidArgument("batch larger than this pass was sized for");
    for (int32_t i = n - k; i < n; ++i) {
      std::copy_n(hidden + (row + i) * E, E, tmp_.data() + static_cast<int64_t>(out_row++) * E);
    }
    row += n;
  }
  n_logit_rows_ = out_row;
  if (out_row > 0) ProjectLogits(out_row);
  return Status::Ok();
}

void Forward::ProjectLogits(int n_rows) {
  const int64_t E = model_.config().n_embd;
  RowsRmsNorm(tmp_.data(), model_.output_norm(), out_in_.data(), n_rows);
  CountMatMul(ForwardProfile::kLogits, model_.output(), n_rows);
  MatMul(model_.output(), out_in_.data(), E, n_rows, logits_.data(), static_cast<int64_t>(n_vocab_), pool_, scratch_);
  if (const float cap = model_.config().final_softcap; cap > 0) {  // Gemma: c tanh(logit / c)
    const size_t n = static_cast<size_t>(n_rows) * n_vocab_;
    for (size_t i = 0; i < n; ++i) logits_[i] = cap * std::tanh(logits_[i] / cap);
  }
}

}  // namespace trellis
