#include "engine/model.h"

#include "kernels/cpu_features.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include <fmt/core.h>

#include "kernels/packed.h"
#include "kernels/quant.h"
#include "util/checksum.h"
#include "util/meminfo.h"
#include "util/log.h"

namespace trellis {
namespace {

// FNV-1a, enough to tell models apart in cache keys.
uint64_t Fnv1a(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

std::string Shape(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

Result<WeightMatrix> GetMatrix(const GgufFile& g, const std::string& name, int64_t cols, int64_t rows) {
  const GgufTensorInfo* t = g.FindTensor(name);
  if (!t) return NotFound(fmt::format("tensor '{}' is missing", name));
  if (t->dims.size() != 2 || t->dims[0] != cols || t->dims[1] != rows) {
    return InvalidArgument(fmt::format("tensor '{}' has shape {}, expected [{}, {}]", name, Shape(t->dims), cols, rows));
  }
  const GgmlTypeTraits tr = GetGgmlTypeTraits(t->type);
  if (!tr.computable) {
    return Unsupported(fmt::format("tensor '{}' has type {}, which Trellis does not support "
                                   "(supported: f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, iq4_nl, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_xs)", name, tr.name));
  }
  return WeightMatrix{t->type, t->data, rows, cols, RowBytes(t->type, cols)};
}

Result<std::vector<float>> GetVector(const GgufFile& g, const std::string& name, int64_t n) {
  const GgufTensorInfo* t = g.FindTensor(name);
  if (!t) return NotFound(fmt::format("tensor '{}' is missing", name));
  if (t->n_elements != n || t->dims[0] != n) {
    return InvalidArgument(fmt::format("tensor '{}' has shape {}, expected [{}]", name, Shape(t->dims), n));
  }
  if (!GetGgmlTypeTraits(t->type).computable) {
    return Unsupported(fmt::format("tensor '{}' has unsupported type {}", name, GetGgmlTypeTraits(t->type).name));
  }
  std::vector<float> out(static_cast<size_t>(n));
  TRELLIS_RETURN_IF_ERROR(DequantizeRow(t->type, t->data, out.data(), n));
  return out;
}

// A tensor the architecture may or may not have: absent leaves *out empty; present, it is
// checked like any other.
Status GetOptionalVector(const GgufFile& g, const std::string& name, int64_t n, std::vector<float>* out) {
  if (!g.FindTensor(name)) return Status::Ok();
  TRELLIS_ASSIGN_OR_RETURN(*out, GetVector(g, name, n));
  return Status::Ok();
}

// The n_expert matrices of a 3-D expert tensor {cols, rows, n_expert}: expert e's slice
// starts at byte e * rows * row_bytes (ggml's nb[2]).
Result<std::vector<WeightMatrix>> GetExperts(const GgufFile& g, const std::string& name, int64_t cols, int64_t rows,
                                             int64_t n_expert) {
  const GgufTensorInfo* t = g.FindTensor(name);
  if (!t) return NotFound(fmt::format("tensor '{}' is missing", name));
  if (t->dims.size() != 3 || t->dims[0] != cols || t->dims[1] != rows || t->dims[2] != n_expert) {
    return InvalidArgument(fmt::format("tensor '{}' has shape {}, expected [{}, {}, {}]", name, Shape(t->dims), cols, rows, n_expert));
  }
  if (!GetGgmlTypeTraits(t->type).computable) {
    return Unsupported(fmt::format("tensor '{}' has type {}, which Trellis does not support", name, GetGgmlTypeTraits(t->type).name));
  }
  const int64_t row_bytes = RowBytes(t->type, cols);
  std::vector<WeightMatrix> out;
  for (int64_t e = 0; e < n_expert; ++e) {
    out.push_back(WeightMatrix{t->type, static_cast<const uint8_t*>(t->data) + e * rows * row_bytes, rows, cols, row_bytes});
  }
  return out;
}

// Rows [row0, row0 + rows) of w, a view into the same bytes.
WeightMatrix RowSlice(const WeightMatrix& w, int64_t row0, int64_t rows) {
  return WeightMatrix{w.type, static_cast<const uint8_t*>(w.data) + row0 * w.row_bytes, rows, w.cols, w.row_bytes};
}

}  // namespace

std::vector<const WeightMatrix*> LayerWeights::Matrices() const {
  std::vector<const WeightMatrix*> v = {&wq,     &wk,         &wv,       &wo,         &w_gate,        &w_up,
                                        &w_down, &router,     &shexp_gate_inp, &shexp_gate, &shexp_up, &shexp_down};
  for (const auto* experts : {&exp_gate, &exp_up, &exp_down}) {
    for (const WeightMatrix& w : *experts) v.push_back(&w);
  }
  return v;
}

std::vector<WeightMatrix*> LayerWeights::Matrices() {
  std::vector<WeightMatrix*> v;
  for (const WeightMatrix* w : static_cast<const LayerWeights*>(this)->Matrices()) v.push_back(const_cast<WeightMatrix*>(w));
  return v;
}

const float* Model::RopeFactors(int n_ctx) const {
  if (!rope_freqs_.empty()) return rope_freqs_.data();
  if (!rope_long_.empty() && n_ctx > config_.n_ctx_orig) return rope_long_.data();
  if (!rope_short_.empty()) return rope_short_.data();
  return nullptr;
}

uint64_t Model::KvFingerprint(int n_ctx) const {
  // Long and short factors rotate K differently: K/V made under one set must never be
  // served to an engine running the other.
  if (!rope_long_.empty() && RopeFactors(n_ctx) == rope_long_.data()) return fingerprint_ ^ 0x4c6f6e67526f5045ull;
  return fingerprint_;
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& path, const ModelPart& part, Env* env) {
  TRELLIS_ASSIGN_OR_RETURN(GgufFile g, GgufFile::Open(path, env));
  auto m = FromGguf(std::move(g), part);
  if (!m.ok()) return m.status().WithContext(path);
  return m;
}

Result<std::unique_ptr<Model>> Model::FromGguf(GgufFile gguf, const ModelPart& part) {
  std::unique_ptr<Model> m(new Model(std::move(gguf), part));
  TRELLIS_RETURN_IF_ERROR(m->Init());
  return m;
}

Status Model::Init() {
  TRELLIS_ASSIGN_OR_RETURN(config_, ModelConfig::FromGguf(gguf_));
  const ModelConfig& c = config_;
  if (part_.last_layer < 0) part_.last_layer = c.n_layer;
  if (part_.first_layer < 0 || part_.first_layer > part_.last_layer || part_.last_layer > c.n_layer) {
    return InvalidArgument(fmt::format("layer range {}-{} is not within the model's {} layers", part_.first_layer,
                                       part_.last_layer - 1, c.n_layer));
  }
  TRELLIS_ASSIGN_OR_RETURN(token_embd_, GetMatrix(gguf_, "token_embd.weight", c.n_embd, c.n_vocab));
  TRELLIS_ASSIGN_OR_RETURN(output_norm_, GetVector(gguf_, "output_norm.weight", c.n_embd));
  // Gemma 2's output is its token embedding whatever the file holds (as in llama.cpp).
  if (gguf_.FindTensor("output.weight") && c.arch != "gemma2") {
    TRELLIS_ASSIGN_OR_RETURN(output_, GetMatrix(gguf_, "output.weight", c.n_embd, c.n_vocab));
  } else {
    output_ = token_embd_;
    tied_output_ = true;
  }
  TRELLIS_RETURN_IF_ERROR(GetOptionalVector(gguf_, "rope_freqs.weight", c.n_rot / 2, &rope_freqs_));
  TRELLIS_RETURN_IF_ERROR(GetOptionalVector(gguf_, "rope_factors_long.weight", c.n_rot / 2, &rope_long_));
  TRELLIS_RETURN_IF_ERROR(GetOptionalVector(gguf_, "rope_factors_short.weight", c.n_rot / 2, &rope_short_));
  layers_.resize(static_cast<size_t>(c.n_layer));
  for (int i = 0; i < c.n_layer; ++i) {
    LayerWeights& l = layers_[static_cast<size_t>(i)];
    const std::string p = fmt::format("blk.{}.", i);
    TRELLIS_ASSIGN_OR_RETURN(l.attn_norm, GetVector(gguf_, p + "attn_norm.weight", c.n_embd));
    const int64_t QD = static_cast<int64_t>(c.n_head) * c.head_dim, KD = c.kv_dim();
    if (gguf_.FindTensor(p + "attn_qkv.weight")) {
      // Fused Q/K/V (Phi-3; llama.cpp accepts it for any architecture): rows [Q; K; V],
      // taken as three views of the one matrix, so the forward pass is unchanged.
      TRELLIS_ASSIGN_OR_RETURN(WeightMatrix qkv, GetMatrix(gguf_, p + "attn_qkv.weight", c.n_embd, QD + 2 * KD));
      l.wq = RowSlice(qkv, 0, QD);
      l.wk = RowSlice(qkv, QD, KD);
      l.wv = RowSlice(qkv, QD + KD, KD);
      std::vector<float> b;
      TRELLIS_RETURN_IF_ERROR(GetOptionalVector(gguf_, p + "attn_qkv.bias", QD + 2 * KD, &b));
      if (!b.empty()) {
        l.bq.assign(b.begin(), b.begin() + QD);
        l.bk.assign(b.begin() + QD, b.begin() + QD + KD);
        l.bv.assign(b.begin() + QD + KD, b.end());
      }
    } else {
      TRELLIS_ASSIGN_OR_RETURN(l.wq, GetMatrix(gguf_, p + "attn_q.weight", c.n_embd, QD));
      TRELLIS_ASSIGN_OR_RETURN(l.wk, GetMatrix(gguf_, p + "attn_k.weight", c.n_embd, KD));
      TRELLIS_ASSIGN_OR_RETURN(l.wv, GetMatrix(gguf_, p + "attn_v.weight", c.n_embd, KD));
      // Biases: Qwen2 has them; llama.cpp loads them for every architecture when present.
      TRELLIS_RETURN_IF_ERROR(GetOptionalVector(gguf_, p + "attn_q.bias", QD, &l.bq));
      TRELLIS_RETURN_IF_ERROR(GetOptionalVector(gguf_, p + "attn_k.bias", KD, &l.bk));
      TRELLIS_RETURN_IF_ERROR(GetOptionalVector(gguf_, p + "attn_v.bias", KD, &l.bv));
    }
    if (c.qk_norm) {
      TRELLIS_ASSIGN_OR_RETURN(l.q_norm, GetVector(gguf_, p + "attn_q_norm.weight", c.head_dim));
      TRELLIS_ASSIGN_OR_RETURN(l.k_norm, GetVector(gguf_, p + "attn_k_norm.weight", c.head_dim));
    }
    TRELLIS_ASSIGN_OR_RETURN(l.wo, GetMatrix(gguf_, p + "attn_output.weight", c.n_head * c.head_dim, c.n_embd));
    TRELLIS_ASSIGN_OR_RETURN(l.ffn_norm, GetVector(gguf_, p + "ffn_norm.weight", c.n_embd));
    if (c.post_norms) {
      TRELLIS_ASSIGN_OR_RETURN(l.attn_post_norm, GetVector(gguf_, p + "post_attention_norm.weight", c.n_embd));
      TRELLIS_ASSIGN_OR_RETURN(l.ffn_post_norm, GetVector(gguf_, p + "post_ffw_norm.weight", c.n_embd));
    }
    if (c.moe()) {
      // Mixtral files from before the 3-D expert tensors (one ffn_gate.E per expert) do
      // not load in llama.cpp either.
      if (gguf_.FindTensor(p + "ffn_gate.0.weight")) {
        return Unsupported(fmt::format("layer {} stores each expert as its own tensor (an old Mixtral conversion): "
                                       "reconvert the model with a current llama.cpp", i));
      }
      TRELLIS_ASSIGN_OR_RETURN(l.router, GetMatrix(gguf_, p + "ffn_gate_inp.weight", c.n_embd, c.n_expert));
      TRELLIS_ASSIGN_OR_RETURN(l.exp_gate, GetExperts(gguf_, p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert));
      TRELLIS_ASSIGN_OR_RETURN(l.exp_up, GetExperts(gguf_, p + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert));
      TRELLIS_ASSIGN_OR_RETURN(l.exp_down, GetExperts(gguf_, p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert));
      if (c.n_ff_shexp > 0) {
        // The shared expert's gate is a vector ({n_embd}): one output row.
        const std::string gi = p + "ffn_gate_inp_shexp.weight";
        const GgufTensorInfo* t = gguf_.FindTensor(gi);
        if (!t) return NotFound(fmt::format("tensor '{}' is missing", gi));
        if (t->dims.size() != 1 || t->dims[0] != c.n_embd) {
          return InvalidArgument(fmt::format("tensor '{}' has shape {}, expected [{}]", gi, Shape(t->dims), c.n_embd));
        }
        if (!GetGgmlTypeTraits(t->type).computable) {
          return Unsupported(fmt::format("tensor '{}' has unsupported type {}", gi, GetGgmlTypeTraits(t->type).name));
        }
        l.shexp_gate_inp = WeightMatrix{t->type, t->data, 1, c.n_embd, RowBytes(t->type, c.n_embd)};
        TRELLIS_ASSIGN_OR_RETURN(l.shexp_gate, GetMatrix(gguf_, p + "ffn_gate_shexp.weight", c.n_embd, c.n_ff_shexp));
        TRELLIS_ASSIGN_OR_RETURN(l.shexp_up, GetMatrix(gguf_, p + "ffn_up_shexp.weight", c.n_embd, c.n_ff_shexp));
        TRELLIS_ASSIGN_OR_RETURN(l.shexp_down, GetMatrix(gguf_, p + "ffn_down_shexp.weight", c.n_ff_shexp, c.n_embd));
      }
    } else if (!gguf_.FindTensor(p + "ffn_gate.weight") && gguf_.FindTensor(p + "ffn_up.weight") &&
               gguf_.FindTensor(p + "ffn_up.weight")->dims.size() == 2 &&
               gguf_.FindTensor(p + "ffn_up.weight")->dims[1] == 2 * c.n_ff) {
      // Fused gate/up (Phi-3): rows [gate; up], SwiGLU of the first half times the second.
      TRELLIS_ASSIGN_OR_RETURN(WeightMatrix gu, GetMatrix(gguf_, p + "ffn_up.weight", c.n_embd, 2 * int64_t{c.n_ff}));
      l.w_gate = RowSlice(gu, 0, c.n_ff);
      l.w_up = RowSlice(gu, c.n_ff, c.n_ff);
    } else {
      TRELLIS_ASSIGN_OR_RETURN(l.w_gate, GetMatrix(gguf_, p + "ffn_gate.weight", c.n_embd, c.n_ff));
      TRELLIS_ASSIGN_OR_RETURN(l.w_up, GetMatrix(gguf_, p + "ffn_up.weight", c.n_embd, c.n_ff));
    }
    if (!c.moe()) {
      TRELLIS_ASSIGN_OR_RETURN(l.w_down, GetMatrix(gguf_, p + "ffn_down.weight", c.n_ff, c.n_embd));
    }
  }
  // Every tensor must belong to a layer the model declares: a block_count smaller than
  // the file's layers would otherwise run a truncated model silently.
  for (const GgufTensorInfo& t : gguf_.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const int layer = std::atoi(t.name.c_str() + 4);
    if (layer >= c.n_layer) {
      return InvalidArgument(fmt::format("tensor '{}' belongs to layer {}, but {}.block_count is {}", t.name, layer, c.arch, c.n_layer));
    }
  }
  uint64_t h = 0xcbf29ce484222325ull;
  // The architecture too: the same tensors under another architecture (llama and qwen2
  // without biases) compute other K/V, which must never be shared through the store.
  h = Fnv1a(h, c.arch.data(), c.arch.size());
  // expert_used_count is metadata only: the same tensors routed through another number
  // of experts compute other K/V.
  const int cfg[] = {c.n_vocab, c.n_embd, c.n_layer, c.n_ff, c.n_head, c.n_head_kv, c.head_dim, c.n_expert,
                     c.n_expert_used, c.n_ff_exp, c.n_ff_shexp};
  h = Fnv1a(h, cfg, sizeof(cfg));
  for (const GgufTensorInfo& t : gguf_.tensors()) {
    h = Fnv1a(h, t.name.data(), t.name.size());
    h = Fnv1a(h, &t.type, sizeof(t.type));
    // All of the data: the fingerprint names K/V in the shared prefix store, where two
    // fine-tunes of one base must never read each other's blocks (~30 GB/s, once at load).
    const uint64_t sum = Checksum64(t.data, t.size_bytes);
    h = Fnv1a(h, &sum, sizeof(sum));
  }
  fingerprint_ = h;
  // A part keeps only its own layers (every tensor was checked above all the same).
  for (int i = 0; i < c.n_layer; ++i) {
    if (!has_layer(i)) layers_[static_cast<size_t>(i)] = LayerWeights{};
  }
  if (!part_.head) {
    output_norm_.clear();
    output_ = WeightMatrix{};
  }
  Repack();
  if (!whole()) DropForeignPages();
  return Status::Ok();
}

// The fingerprint read every byte of the file; a part gives back the pages of tensors it
// does not use (clean file pages: nothing is lost, they would re-read if touched).
void Model::DropForeignPages() {
  const long page = sysconf(_SC_PAGESIZE);
  for (const GgufTensorInfo& t : gguf_.tensors()) {
    bool mine = false;
    if (t.name.rfind("blk.", 0) == 0) {
      mine = has_layer(std::atoi(t.name.c_str() + 4));
    } else if (t.name == "token_embd.weight") {
      mine = part_.embed || (part_.head && tied_output_);
    } else if (t.name == "output.weight" || t.name == "output_norm.weight") {
      mine = part_.head;
    } else {
      mine = true;  // rope_freqs and the like: small, used by every layer
    }
    if (mine) continue;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
    const uintptr_t end = begin + static_cast<uintptr_t>(t.size_bytes);
    const uintptr_t a = (begin + page - 1) / page * page, e = end / page * page;
    if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_DONTNEED);
  }
}

void Model::Repack() {
  if (!ChosenKernels().repack) return;
  std::vector<WeightMatrix*> mats;
  for (int i = part_.first_layer; i < part_.last_layer; ++i) {
    LayerWeights& l = layers_[static_cast<size_t>(i)];
    for (WeightMatrix* w : l.Matrices()) {
      if (w->rows > 0 && PackingUseful(*w)) mats.push_back(w);
    }
  }
  if (part_.head && PackingUseful(output_)) mats.push_back(&output_);
  if (mats.empty()) return;
  std::vector<size_t> offset;
  size_t total = 0;
  for (const WeightMatrix* w : mats) {
    offset.push_back(total);
    total += PackedBytes(*w);  // a multiple of 64
  }
  // The packed copy is anonymous memory: where it would not fit in what the system has
  // available, keep running from the file (its pages can be evicted and re-read).
  const int64_t available = MemAvailableBytes();
  if (available >= 0 && static_cast<double>(total) > 0.8 * static_cast<double>(available)) {
    TRELLIS_LOG_WARN("not repacking weights: {} MiB needed, {} MiB available; using the slower file layout",
                     total >> 20, available >> 20);
    return;
  }
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t alloc = (total + kHuge - 1) / kHuge * kHuge;
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(kHuge, alloc));
  if (buf == nullptr) return;  // keep the file layout: slower, still correct
  // Huge pages cut TLB misses while kernels stream weights; a hint, so errors are ignored.
  madvise(buf, alloc, MADV_HUGEPAGE);
  packed_.reset(buf);
  packed_bytes_ = total;
  // Pack on all cores, one matrix at a time, and drop each matrix's file pages as soon as
  // it is packed (clean pages: they re-read from the file if GetRow or another path
  // touches them), so resident memory never holds much more than one copy of the model.
  const int n_threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  const long page = sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < mats.size(); ++i) {
    WeightMatrix& w = *mats[i];
    const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
    auto work = [&](int ith) { PackWeights(w, groups * ith / n_threads, groups * (ith + 1) / n_threads, buf + offset[i]); };
    std::vector<std::thread> threads;
    for (int t = 1; t < n_threads; ++t) threads.emplace_back(work, t);
    work(0);
    for (std::thread& t : threads) t.join();
    w.packed = buf + offset[i];
    if (tied_output_ && &w == &output_) continue;  // token_embd rows are still read
    const uintptr_t begin = reinterpret_cast<uintptr_t>(w.data);
    const uintptr_t end = begin + static_cast<uintptr_t>(w.rows * w.row_bytes);
    const uintptr_t a = (begin + page - 1) / page * page, e = end / page * page;
    if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_DONTNEED);
  }
}

std::string Model::TypeSummary() const {
  std::map<std::string, int64_t> bytes;
  for (int i = part_.first_layer; i < part_.last_layer; ++i) {
    const LayerWeights& l = layers_[static_cast<size_t>(i)];
    for (const WeightMatrix* w : l.Matrices()) {
      if (w->rows > 0) bytes[std::string(GetGgmlTypeTraits(w->type).name)] += w->rows * w->row_bytes;
    }
  }
  std::string main;
  int64_t best = -1;
  for (const auto& [name, b] : bytes) {
    if (b > best) {
      best = b;
      main = name;
    }
  }
  std::string s = main;
  if (bytes.size() > 1) s += " mix";
  if (part_.head) {
    const std::string out_type(GetGgmlTypeTraits(output_.type).name);
    if (out_type != main) s += fmt::format(" ({} output)", out_type);
  }
  return s;
}

// Sums per(w) over the matrices this part holds (the output head included); with
// active_only, a mixture's experts count by the share a token routes through.
template <typename F>
int64_t Model::SumOverMatrices(F per, bool active_only) const {
  int64_t total = part_.head ? per(output_) : 0, experts = 0;
  for (int i = part_.first_layer; i < part_.last_layer; ++i) {
    const LayerWeights& l = layers_[static_cast<size_t>(i)];
    for (const WeightMatrix* w : l.Matrices()) total += per(*w);
    for (const auto* v : {&l.exp_gate, &l.exp_up, &l.exp_down}) {
      for (const WeightMatrix& w : *v) experts += per(w);
    }
  }
  if (!active_only || !config_.moe()) return total;
  return total - experts + experts / config_.n_expert * config_.n_expert_used;
}

int64_t Model::WeightBytes() const {
  return SumOverMatrices([](const WeightMatrix& w) { return w.rows * w.row_bytes; }, false);
}

int64_t Model::ActiveWeightBytes() const {
  return SumOverMatrices([](const WeightMatrix& w) { return w.rows * w.row_bytes; }, true);
}

int64_t Model::ActiveMacsPerToken() const {
  return SumOverMatrices([](const WeightMatrix& w) { return w.rows * w.cols; }, true);
}

}  // namespace trellis
