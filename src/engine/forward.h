// Forward: one llama forward pass over a batch of token runs from any number of
// sequences, reading and writing K/V through each sequence's block table.
//
// A batch mixes prefill chunks and decode tokens freely: every weight matrix is
// applied once to all rows of the batch (prefill is matrix x matrix; concurrent decode
// streams the weights once per step). All activation buffers are sized at construction
// for max_batch_tokens rows; Run() performs no heap allocation.
//
// The pass reads top to bottom like the model (see Run in forward.cc):
//   x = embd[token]
//   per layer: q, k, v = Wq . norm(x) (+ bq), Wk . norm(x) (+ bk), Wv . norm(x) (+ bv)
//              q, k = headnorm(q), headnorm(k)       (qwen3)
//              x += postnorm(Wo . attn(rope(q), rope(k), v))   (postnorm: Gemma; else identity)
//              (Gemma: scores soft-capped; window layers attend to the last n_swa positions)
//              x += postnorm(Wdown . (act(Wgate . norm(x)) * (Wup . norm(x))))   act: silu, Gemma gelu
//   logits = Wout . norm(x)   (only for the rows a sequence asks for; Gemma: soft-capped)
//   (Gemma: x = embd[token] * sqrt(n_embd))
//
// A model split across processes (the grid) runs the same pass in stages: Prepare
// (embed, or take hidden states from the previous stage), RunLayers (this process's
// layers, model.part()), ComputeLogits. The KV pool then holds only this process's
// layers: layer i of the model is layer i - part.first_layer of the pool.
//
// Thread safety: not thread-safe; one engine thread calls Run. Kernels fan out on the
// ThreadPool given at construction. The Model and KV memory are borrowed.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/model.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace trellis {

// One sequence's part of a batch.
struct SeqBatch {
  std::span<const int32_t> tokens;       // tokens to run, at positions pos0 ..
  int32_t pos0 = 0;                      // number of tokens already in this sequence's KV
  std::span<const int32_t> block_table;  // must cover positions [0, pos0 + tokens.size())
  int32_t n_logits = 1;                  // logits for this many trailing tokens (0..tokens.size())
};

// Where forward passes' wall time goes, phase by phase (`bench speed --budget`): the
// phases of a pass run one after another on the calling thread, each waiting for the pool,
// so their times add up to the pass's. Summed over every pass run while attached
// (Forward::set_profile). Per phase also the work done, for its own limit: multiply-adds
// and weight bytes of the matrix products (act_ns: the part of ns spent converting their
// activations), attention's FLOPs.
struct ForwardProfile {
  enum Phase : int {
    kEmbed,      // Prepare: embeddings, plan
    kNorm,       // RMS norms of the residual stream (and post-norms)
    kQkv,        // the q / k / v products
    kRope,       // biases, Q/K norms, rotary embedding
    kKvWrite,    // K/V into the cache (and the Hadamard rotations of a quantized one)
    kAttention,  // paged attention
    kOut,        // the output projection (wo)
    kResidual,   // the residual adds
    kFfnIn,      // gate / up products
    kFfnAct,     // SwiGLU / GeGLU
    kFfnDown,    // the down product
    kRouting,    // mixture of experts: router, grouping, gather and scatter
    kLogits,     // output norm, vocabulary product, soft-cap
    kPhases
  };
  struct Counts {
    int64_t ns = 0, act_ns = 0;
    double macs = 0, float_macs = 0, weight_bytes = 0, flops = 0;  // float_macs: of F32 / F16 / BF16 weights
  };
  std::array<Counts, kPhases> phase{};
  int64_t passes = 0, tokens = 0, layer_passes = 0;  // layer_passes: layers run, summed over passes
  static const char* Name(int phase);
  int64_t TotalNs() const;
};

class Forward {
 public:
  // max_logit_rows bounds the sum of n_logits over a batch. n_ctx, the per-session
  // context (0: config().DefaultContext()), selects LongRoPE's factor set.
  Forward(const Model& model, const PagedKv& kv, int max_batch_tokens, int max_logit_rows,
          ThreadPool& pool, int n_ctx = 0);
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  // Runs the batch. On success logits() holds, for each sequence in order, its
  // n_logits rows of n_vocab floats. Errors (bad token id, block table too short,
  // batch too large) are detected before any KV is written.
  // REQUIRES: the model is whole (model().whole()).
  Status Run(std::span<const SeqBatch> seqs);

  // --- stages ---
  // Plans the batch (same checks as Run) and fills the hidden state: hidden_in == null
  // embeds the tokens (the part must hold the embeddings), otherwise copies
  // hidden_rows() x n_embd floats from hidden_in (token values are then ignored).
  Status Prepare(std::span<const SeqBatch> seqs, const float* hidden_in = nullptr);
  // Runs this part's layers over the prepared batch, in place.
  void RunLayers();
  // The prepared batch's hidden state: [hidden_rows()][n_embd].
  float* hidden() { return x_.data(); }
  int hidden_rows() const { return n_rows_; }
  // Logits of a batch whose hidden state (after the last layer) is `hidden`:
  // n_tokens[i] rows per sequence, the last n_logits[i] of which want logits. The part
  // must hold the output head. `hidden` may be hidden(); the prepared batch stays.
  Status ComputeLogits(std::span<const int32_t> n_tokens, std::span<const int32_t> n_logits, const float* hidden);

  // [sum of n_logits][n_vocab], valid until the next Run.
  std::span<const float> logits() const { return {logits_.data(), static_cast<size_t>(n_logit_rows_) * n_vocab_}; }
  const float* logits_row(int i) const { return logits_.data() + static_cast<size_t>(i) * n_vocab_; }
  int max_batch_tokens() const { return max_tokens_; }
  int max_logit_rows() const { return max_logit_rows_; }
  const Model& model() const { return model_; }
  // Attaches a profile that every later Run adds its phases to (nullptr detaches; the
  // stages below are not profiled). Costs one clock read per phase while attached.
  void set_profile(ForwardProfile* profile) { profile_ = profile; }

 private:
  // Adds the time since the previous mark to phase p (when a profile is attached).
  void Mark(ForwardProfile::Phase p);
  // Counts w's product over n rows of activations into phase p and points the matmul's
  // activation timer at it.
  void CountMatMul(ForwardProfile::Phase p, const WeightMatrix& w, int64_t n);
  // fn(begin, end, thread) over [0, n) on the pool, or all of it on the calling thread
  // when the work (`floats` touched) is too small for a fork/join to pay.
  template <class Fn>
  void ForRange(int64_t n, int64_t floats, Fn&& fn);
  void RowsRmsNorm(const float* in, const std::vector<float>& w, float* out, int n_rows);
  void AddInPlace(float* x, const float* y, int64_t n);
  // Rows of `width` floats: x[r] += b (nothing if b is empty).
  void AddBias(float* x, int64_t width, const std::vector<float>& b, int n_rows);
  // Each head_dim run of each row RMS-normed with weight w (Qwen3's Q/K norm).
  void HeadsRmsNorm(float* x, int64_t width, const std::vector<float>& w, int n_heads, int n_rows);
  void ProjectLogits(int n_rows);  // tmp_[0, n_rows) -> logits_
  // A gated feed-forward network over n_rows rows of x (n_embd wide): down(act(gate x) *
  // up x) into out, act SwiGLU (GeGLU for Gemma); width gate.rows. The dense FFN, each
  // expert and qwen2moe's shared expert. Uses gate_ and up_.
  void GatedFfn(const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down, const float* x,
                int n_rows, float* out);
  // A mixture of experts' feed-forward block: xn_ -> tmp_. The router picks each row's
  // experts; the rows are grouped by expert and each expert that has rows runs them as
  // one batch (gathered into xe_, its output scattered back times the row's weight), so
  // a decode step reads only the chosen experts' weights.
  void MoeFfn(const LayerWeights& l, int n_rows);
  // qwen2moe's shared expert, added to tmp_ (MoeFfn's output).
  void SharedExpert(const LayerWeights& l, int n_rows);

  const Model& model_;
  PagedKv kv_;
  ThreadPool& pool_;
  const int max_tokens_;
  const int max_logit_rows_;
  const size_t n_vocab_;
  int n_logit_rows_ = 0;
  int n_rows_ = 0;
  RopeParams rope_{};
  RopeParams rope_swa_{};  // sliding-window layers' RoPE (Gemma)
  int rot_k_ = 0, rot_v_ = 0;  // Hadamard chunk sizes around a quantized cache (KvRotationK/V), 0: none

  // Activations, T = max_batch_tokens rows each.
  std::vector<float> x_;     // (T, n_embd) residual stream
  std::vector<float> xn_;    // (T, n_embd) normed input of the current sublayer
  std::vector<float> q_;     // (T, n_head * head_dim)
  std::vector<float> k_;     // (T, kv_dim)
  std::vector<float> v_;     // (T, kv_dim)
  std::vector<float> attn_;  // (T, n_head * head_dim) attention output
  std::vector<float> tmp_;   // (T, n_embd) sublayer output before the residual add
  std::vector<float> gate_;  // (T, n_ff)
  std::vector<float> up_;    // (T, n_ff)
  std::vector<int32_t> pos_;  // (T) position of each row
  std::vector<float> rope_cs_, rope_swa_cs_;  // (T, n_rot) each row's RoPE cos and sin (RopeTables); SWA layers'
  // Mixture of experts (empty for a dense model).
  std::vector<float> router_;       // (T, n_expert) router logits
  std::vector<int32_t> exp_ids_;    // (T, k) each row's experts
  std::vector<float> exp_w_;        // (T, k) and their weights
  std::vector<int32_t> exp_count_;  // (n_expert + 1) rows per expert, then offsets
  std::vector<int32_t> exp_slots_;  // (T * k) row * k + slot, grouped by expert
  std::vector<float> route_scratch_;  // (n_expert)
  std::vector<float> shexp_gate_;   // (T) the shared expert's gate logit per row
  std::vector<float> xe_;           // (T, n_embd) one expert's gathered input rows
  std::vector<float> de_;           // (T, n_embd) its output rows
  std::vector<float> out_in_;  // (L, n_embd) normed rows that want logits
  std::vector<float> logits_;  // (L, n_vocab)
  std::vector<AttnSeq> attn_seqs_;  // per sequence, capacity T
  std::vector<uint8_t, std::allocator<uint8_t>> scratch_raw_;  // matmul scratch (+64 for alignment)
  void* scratch_ = nullptr;
  std::vector<float> attn_scratch_;
  ForwardProfile* profile_ = nullptr;
  int64_t mark_ns_ = 0;
};

}  // namespace trellis
