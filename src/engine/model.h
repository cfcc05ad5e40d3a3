// Model: a model's config and weights, loaded from a GGUF file (the architectures are
// listed in model/model_config.h).
//
// Weight matrices are borrowed views into the read-only mmapped file: loading copies
// nothing but the small norm vectors (converted to f32), except where the CPU has faster
// kernels for a repacked layout (kernels/packed.h): those matrices get a packed copy in
// memory, built once at load, and their file pages are dropped from memory again, so
// the resident size stays about the model's. KernelChoice::repack = false (TRELLIS_REPACK=0) turns repacking off. Every tensor the forward pass
// uses is checked for presence, shape and a type Trellis can compute with, so a bad file
// fails here with a message naming the tensor, not later inside a kernel.
//
// Thread safety: immutable after Load; shared read-only by all threads.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "util/env.h"
#include "util/status.h"

namespace trellis {

struct LayerWeights {
  std::vector<float> attn_norm;  // [n_embd]
  WeightMatrix wq;               // (n_head * head_dim rows, n_embd cols): q = wq . x
  WeightMatrix wk;               // (kv_dim, n_embd)
  WeightMatrix wv;               // (kv_dim, n_embd)
  std::vector<float> bq, bk, bv;  // attn_{q,k,v}.bias, added after the matmul; empty if absent
  std::vector<float> q_norm, k_norm;  // [head_dim] per-head RMSNorm weights (config.qk_norm)
  WeightMatrix wo;               // (n_embd, n_head * head_dim)
  std::vector<float> attn_post_norm, ffn_post_norm;  // [n_embd] (config.post_norms)
  std::vector<float> ffn_norm;   // [n_embd]
  WeightMatrix w_gate;           // (n_ff, n_embd)
  WeightMatrix w_up;             // (n_ff, n_embd)
  WeightMatrix w_down;           // (n_embd, n_ff)
  // Mixture of experts (config.moe(); the dense w_gate / w_up / w_down are then empty):
  // the router and, per expert, views of its slice of the 3-D expert tensors (no copy;
  // each is repacked on its own like any matrix).
  WeightMatrix router;                 // ffn_gate_inp (n_expert, n_embd)
  std::vector<WeightMatrix> exp_gate;  // [n_expert] (n_ff_exp, n_embd)
  std::vector<WeightMatrix> exp_up;    // [n_expert] (n_ff_exp, n_embd)
  std::vector<WeightMatrix> exp_down;  // [n_expert] (n_embd, n_ff_exp)
  // qwen2moe's shared expert: a dense SwiGLU FFN of width n_ff_shexp every token runs,
  // its output times sigmoid(shexp_gate_inp . x) (one row: a scalar per token).
  WeightMatrix shexp_gate_inp;         // (1, n_embd)
  WeightMatrix shexp_gate, shexp_up;   // (n_ff_shexp, n_embd)
  WeightMatrix shexp_down;             // (n_embd, n_ff_shexp)

  // Every weight matrix of the layer (the empty ones of the other kind included; their
  // rows are 0): for repacking, sizing scratch and counting bytes.
  std::vector<const WeightMatrix*> Matrices() const;
  std::vector<WeightMatrix*> Matrices();
};

// Which part of a model a process holds. A grid node holds a range of layers; the head
// holds the embeddings and the output head, and optionally the first layers. The
// default is the whole model.
struct ModelPart {
  int first_layer = 0;   // layers [first_layer, last_layer) are loaded
  int last_layer = -1;   // -1: through the model's last layer
  bool embed = true;     // token embeddings
  bool head = true;      // output norm and output matrix
};

class Model {
 public:
  // A part other than the whole model checks every tensor as usual and computes the
  // same fingerprint (over all of the file), but keeps only its own tensors: the other
  // layers' weights are empty, never repacked, and their file pages are dropped, so
  // resident memory follows the part's share.
  // env: where the file is mapped from (util/env.h; tests fail the map on purpose).
  static Result<std::unique_ptr<Model>> Load(const std::string& path, const ModelPart& part = {}, Env* env = Env::Default());
  // Builds from an already-open GGUF (tests); takes ownership.
  static Result<std::unique_ptr<Model>> FromGguf(GgufFile gguf, const ModelPart& part = {});

  const ModelConfig& config() const { return config_; }
  const GgufFile& gguf() const { return gguf_; }

  const WeightMatrix& token_embd() const { return token_embd_; }  // (n_vocab, n_embd)
  const std::vector<float>& output_norm() const { return output_norm_; }  // [n_embd]
  const WeightMatrix& output() const { return output_; }  // (n_vocab, n_embd); token_embd if tied
  bool tied_output() const { return tied_output_; }
  // REQUIRES: has_layer(i) for its weights to be there.
  const LayerWeights& layer(int i) const { return layers_[static_cast<size_t>(i)]; }
  // The part this process holds; first_layer/last_layer resolved (last_layer <= n_layer).
  const ModelPart& part() const { return part_; }
  bool has_layer(int i) const { return i >= part_.first_layer && i < part_.last_layer; }
  int n_local_layers() const { return part_.last_layer - part_.first_layer; }
  bool whole() const { return part_.embed && part_.head && part_.first_layer == 0 && part_.last_layer == config_.n_layer; }
  // Llama 3.1 style rope frequency factors [n_rot / 2], or empty.
  const std::vector<float>& rope_freqs() const { return rope_freqs_; }
  // The frequency divisors RoPE uses in a context of n_ctx positions per session, or null:
  // rope_freqs if present, else LongRoPE's long factors when n_ctx exceeds the original
  // context (config().n_ctx_orig) and its short ones otherwise, as llama.cpp chooses.
  const float* RopeFactors(int n_ctx) const;
  // fingerprint(), changed when n_ctx selects LongRoPE's long factors: what names K/V in
  // the prefix cache and the store, which differ between the two factor sets.
  uint64_t KvFingerprint(int n_ctx) const;

  // "q4_0 (q6_K output)": the dominant weight type, for banners and benchmarks.
  std::string TypeSummary() const;
  // Bytes of this part's weight matrices (every expert of a mixture included).
  int64_t WeightBytes() const;
  // Bytes one token's decode step reads: WeightBytes(), but of a mixture's experts only
  // the n_expert_used / n_expert share a token routes through.
  int64_t ActiveWeightBytes() const;
  // Matmul multiply-adds one token costs, over the same matrices as ActiveWeightBytes()
  // (attention's own products left out): the arithmetic a prefill token needs.
  int64_t ActiveMacsPerToken() const;
  // Identifies the weights for cache and store keys: hash of the config, the tensor
  // table and every weight byte (XXH3).
  uint64_t fingerprint() const { return fingerprint_; }
  // Tests only: a mixture routed by another rule (reference_test.cc's broken-rule
  // variants, which must fail against llama.cpp). Call before building a Forward.
  void SetExpertRoutingForTesting(ExpertGating gating, bool renormalize, int k) {
    config_.expert_gating = gating;
    config_.expert_renorm = renormalize;
    config_.n_expert_used = k;
  }
  // Bytes of weights held in a repacked layout (0 if none).
  size_t packed_bytes() const { return packed_bytes_; }

 private:
  template <typename F>
  int64_t SumOverMatrices(F per, bool active_only) const;
  explicit Model(GgufFile gguf, const ModelPart& part) : gguf_(std::move(gguf)), part_(part) {}
  Status Init();
  void Repack();
  void DropForeignPages();

  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };

  GgufFile gguf_;
  ModelPart part_;
  ModelConfig config_;
  WeightMatrix token_embd_{};
  std::vector<float> output_norm_;
  WeightMatrix output_{};
  bool tied_output_ = false;
  std::vector<LayerWeights> layers_;
  std::vector<float> rope_freqs_;
  std::vector<float> rope_long_, rope_short_;  // Phi-3 LongRoPE, [n_rot / 2] each
  uint64_t fingerprint_ = 0;
  std::unique_ptr<uint8_t, FreeDeleter> packed_;
  size_t packed_bytes_ = 0;
};

}  // namespace trellis
