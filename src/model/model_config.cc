#include "model/model_config.h"

#include <cmath>

#include <fmt/core.h>

namespace trellis {
namespace {

Result<int> GetPositiveInt(const GgufFile& g, const std::string& key, uint64_t max) {
  auto v = g.GetUint(key);
  if (!v.ok()) return v.status();
  if (*v == 0 || *v > max) return InvalidArgument(fmt::format("metadata '{}' = {} is out of range (1..{})", key, *v, max));
  return static_cast<int>(*v);
}

}  // namespace

Result<ModelConfig> ModelConfig::FromGguf(const GgufFile& g) {
  ModelConfig c;
  TRELLIS_ASSIGN_OR_RETURN(c.arch, g.GetString("general.architecture"));
  if (c.arch != "llama") {
    return Unsupported(fmt::format("architecture '{}' is not supported (Trellis runs llama-family models: "
                                   "TinyLlama, Llama 2/3, Mistral)", c.arch));
  }
  if (auto n = g.GetString("general.name"); n.ok()) c.name = *n;
  const std::string p = c.arch + ".";
  TRELLIS_ASSIGN_OR_RETURN(c.n_embd, GetPositiveInt(g, p + "embedding_length", 1 << 16));
  TRELLIS_ASSIGN_OR_RETURN(c.n_layer, GetPositiveInt(g, p + "block_count", 1024));
  TRELLIS_ASSIGN_OR_RETURN(c.n_ff, GetPositiveInt(g, p + "feed_forward_length", 1 << 18));
  TRELLIS_ASSIGN_OR_RETURN(c.n_head, GetPositiveInt(g, p + "attention.head_count", 1024));
  c.n_head_kv = c.n_head;
  if (g.Has(p + "attention.head_count_kv")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_head_kv, GetPositiveInt(g, p + "attention.head_count_kv", 1024));
  }
  c.n_ctx_train = 4096;
  if (g.Has(p + "context_length")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_ctx_train, GetPositiveInt(g, p + "context_length", 1 << 24));
  }
  if (c.n_embd % c.n_head != 0) {
    return InvalidArgument(fmt::format("embedding_length {} is not a multiple of head_count {}", c.n_embd, c.n_head));
  }
  if (c.n_head % c.n_head_kv != 0) {
    return InvalidArgument(fmt::format("head_count {} is not a multiple of head_count_kv {}", c.n_head, c.n_head_kv));
  }
  c.head_dim = c.n_embd / c.n_head;
  c.n_rot = c.head_dim;
  if (g.Has(p + "rope.dimension_count")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_rot, GetPositiveInt(g, p + "rope.dimension_count", 1 << 16));
  }
  if (c.n_rot != c.head_dim) {
    return Unsupported(fmt::format("partial rotary embedding (rope.dimension_count {} != head dim {})", c.n_rot, c.head_dim));
  }
  if (g.Has(p + "rope.freq_base")) {
    TRELLIS_ASSIGN_OR_RETURN(double b, g.GetFloat(p + "rope.freq_base"));
    if (!(b > 1.0) || !std::isfinite(b)) return InvalidArgument(fmt::format("rope.freq_base {} must be finite and > 1", b));
    c.rope_freq_base = static_cast<float>(b);
  }
  if (g.Has(p + "rope.scaling.type")) {
    TRELLIS_ASSIGN_OR_RETURN(std::string type, g.GetString(p + "rope.scaling.type"));
    if (type == "linear") {
      TRELLIS_ASSIGN_OR_RETURN(double f, g.GetFloat(p + "rope.scaling.factor"));
      if (!(f > 0) || !std::isfinite(f)) return InvalidArgument(fmt::format("rope.scaling.factor {} must be finite and > 0", f));
      c.rope_freq_scale = static_cast<float>(1.0 / f);
    } else if (type != "none") {
      return Unsupported(fmt::format("rope scaling type '{}' (supported: none, linear, and llama3 via rope_freqs)", type));
    }
  } else if (g.Has(p + "rope.scale_linear")) {
    TRELLIS_ASSIGN_OR_RETURN(double f, g.GetFloat(p + "rope.scale_linear"));
    if (f > 0) c.rope_freq_scale = static_cast<float>(1.0 / f);
  }
  if (g.Has(p + "attention.layer_norm_rms_epsilon")) {
    TRELLIS_ASSIGN_OR_RETURN(double e, g.GetFloat(p + "attention.layer_norm_rms_epsilon"));
    if (!(e > 0 && e < 1)) return InvalidArgument(fmt::format("layer_norm_rms_epsilon {} out of range", e));
    c.rms_eps = static_cast<float>(e);
  }
  // The vocab size comes from the token list when the key is absent.
  if (g.Has(p + "vocab_size")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_vocab, GetPositiveInt(g, p + "vocab_size", 1 << 22));
  } else if (auto toks = g.GetArray("tokenizer.ggml.tokens", GgufValueType::kString); toks.ok()) {
    c.n_vocab = static_cast<int>((*toks)->count);
  } else {
    return InvalidArgument("neither llama.vocab_size nor tokenizer.ggml.tokens is present");
  }
  return c;
}

}  // namespace trellis
