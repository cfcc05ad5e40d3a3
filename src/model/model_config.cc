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

Result<double> GetPositiveFloat(const GgufFile& g, const std::string& key, double max) {
  auto v = g.GetFloat(key);
  if (!v.ok()) return v.status();
  if (!(*v > 0 && *v <= max)) return InvalidArgument(fmt::format("metadata '{}' = {} is out of range (0, {}]", key, *v, max));
  return *v;
}

// Gemma 2/3's keys, with llama.cpp's defaults where a key is absent.
// YaRN (rope.scaling.type "yarn"): the factor and llama.cpp's optional overrides of its
// defaults (ext_factor 1, beta_fast 32, beta_slow 1).
Status ReadYarnKeys(const GgufFile& g, const std::string& p, ModelConfig* c) {
  TRELLIS_ASSIGN_OR_RETURN(double f, g.GetFloat(p + "rope.scaling.factor"));
  if (!(f > 0 && f <= 1024)) return InvalidArgument(fmt::format("rope.scaling.factor {} must be in (0, 1024] for yarn", f));
  c->rope_freq_scale = static_cast<float>(1.0 / f);
  c->rope_yarn_ext_factor = 1.0f;
  const std::pair<const char*, float*> keys[] = {{"rope.scaling.yarn_ext_factor", &c->rope_yarn_ext_factor},
                                                 {"rope.scaling.yarn_beta_fast", &c->rope_yarn_beta_fast},
                                                 {"rope.scaling.yarn_beta_slow", &c->rope_yarn_beta_slow}};
  for (auto [key, dst] : keys) {
    if (!g.Has(p + key)) continue;
    TRELLIS_ASSIGN_OR_RETURN(double v, g.GetFloat(p + key));
    if (!(v >= 0 && v <= 1024)) return InvalidArgument(fmt::format("{} {} out of range [0, 1024]", key, v));
    *dst = static_cast<float>(v);
  }
  if (c->rope_yarn_ext_factor > 1) return InvalidArgument(fmt::format("rope.scaling.yarn_ext_factor {} above 1", c->rope_yarn_ext_factor));
  return Status::Ok();
}

Status ReadGemmaKeys(const GgufFile& g, const std::string& p, ModelConfig* c) {
  const bool g2 = c->arch == "gemma2";
  c->embd_scale = std::sqrt(static_cast<float>(c->n_embd));
  c->attn_softcap = g2 ? 50.0f : 0.0f;
  c->final_softcap = g2 ? 30.0f : 0.0f;
  if (g.Has(p + "attn_logit_softcapping") && g2) {
    TRELLIS_ASSIGN_OR_RETURN(double v, GetPositiveFloat(g, p + "attn_logit_softcapping", 1e6));
    c->attn_softcap = static_cast<float>(v);
  }
  if (g.Has(p + "final_logit_softcapping")) {
    TRELLIS_ASSIGN_OR_RETURN(double v, GetPositiveFloat(g, p + "final_logit_softcapping", 1e6));
    c->final_softcap = static_cast<float>(v);
  }
  // Gemma 2 always slides (window 4096 unless the file says); Gemma 3 when the file says.
  c->n_swa = g2 ? 4096 : 0;
  if (g.Has(p + "attention.sliding_window")) {
    TRELLIS_ASSIGN_OR_RETURN(c->n_swa, GetPositiveInt(g, p + "attention.sliding_window", 1 << 24));
  }
  c->swa_period = g2 ? 2 : 6;
  if (g.Has(p + "attention.sliding_window_pattern")) {
    auto v = g.GetUint(p + "attention.sliding_window_pattern");
    if (!v.ok()) {
      return Unsupported(fmt::format("metadata '{}attention.sliding_window_pattern' is not a number (a per-layer "
                                     "array is not supported)", p));
    }
    if (*v > 1024) return InvalidArgument(fmt::format("sliding_window_pattern {} out of range", *v));
    c->swa_period = static_cast<int>(*v);
  }
  c->rope_freq_base_swa = g2 ? c->rope_freq_base : 10000.0f;
  if (g.Has(p + "rope.freq_base_swa")) {
    TRELLIS_ASSIGN_OR_RETURN(double b, GetPositiveFloat(g, p + "rope.freq_base_swa", 1e12));
    c->rope_freq_base_swa = static_cast<float>(b);
  }
  // llama.cpp (after gemma_pytorch): the 27B models scale scores by n_embd / n_head
  // (their query_pre_attn_scalar), the others by the head dim; the file does not say.
  const bool is_27b = c->n_layer == (g2 ? 46 : 62);
  c->attn_scale = 1.0f / std::sqrt(static_cast<float>(is_27b ? c->n_embd / c->n_head : c->head_dim));
  return Status::Ok();
}

// expert_count / expert_used_count: both or neither (a dense model), 1 <= used <= count
// <= 1024 as llama.cpp checks. The gating rule is the architecture's, never the file's.
Status ReadExpertKeys(const GgufFile& g, const std::string& p, ModelConfig* c) {
  const bool has = g.Has(p + "expert_count");
  if (has) {
    auto n = g.GetUint(p + "expert_count");
    if (!n.ok()) return n.status();
    if (*n == 0) return Status::Ok();  // some converters write 0 for dense models
  } else if (c->arch != "qwen3moe" && c->arch != "qwen2moe") {
    return Status::Ok();
  }
  TRELLIS_ASSIGN_OR_RETURN(c->n_expert, GetPositiveInt(g, p + "expert_count", 1024));
  TRELLIS_ASSIGN_OR_RETURN(c->n_expert_used, GetPositiveInt(g, p + "expert_used_count", 1024));
  if (c->n_expert_used > c->n_expert) {
    return InvalidArgument(fmt::format("{}expert_used_count {} exceeds expert_count {}", p, c->n_expert_used, c->n_expert));
  }
  c->expert_renorm = c->arch != "qwen2moe";  // qwen3moe and Mixtral renormalize (docs/moe.md)
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ModelConfig::FromGguf(const GgufFile& g) {
  ModelConfig c;
  TRELLIS_ASSIGN_OR_RETURN(c.arch, g.GetString("general.architecture"));
  // The mixtures share their dense family's attention (qwen3moe Qwen3's, qwen2moe Qwen2's).
  if (c.arch == "qwen2" || c.arch == "qwen2moe") {
    c.rope_neox = true;
  } else if (c.arch == "qwen3" || c.arch == "qwen3moe") {
    c.rope_neox = true;
    c.qk_norm = true;
  } else if (c.arch == "phi3") {
    c.rope_neox = true;
  } else if (c.arch == "gemma2" || c.arch == "gemma3") {
    c.rope_neox = true;
    c.post_norms = true;
    c.ffn_gelu = true;
    c.qk_norm = c.arch == "gemma3";
  } else if (c.arch == "gpt-oss" || c.arch == "mixtral") {
    return Unsupported(fmt::format("'{}' is a mixture-of-experts architecture Trellis does not run yet (docs/moe.md); "
                                   "supported: llama (Mixtral too), qwen2, qwen2moe, qwen3, qwen3moe, phi3, gemma2, gemma3",
                                   c.arch));
  } else if (c.arch != "llama") {
    return Unsupported(fmt::format("architecture '{}' is not supported (supported: llama (TinyLlama, Llama 2/3, "
                                   "Mistral, SmolLM, Mixtral), qwen2 (Qwen2, Qwen2.5), qwen2moe, qwen3, qwen3moe, phi3 (Phi-3, Phi-3.5, Phi-4-mini), "
                                   "gemma2, gemma3)",
                                   c.arch));
  }
  if (auto n = g.GetString("general.name"); n.ok()) c.name = *n;
  const std::string p = c.arch + ".";
  TRELLIS_ASSIGN_OR_RETURN(c.n_embd, GetPositiveInt(g, p + "embedding_length", 1 << 16));
  TRELLIS_ASSIGN_OR_RETURN(c.n_layer, GetPositiveInt(g, p + "block_count", 1024));
  TRELLIS_RETURN_IF_ERROR(ReadExpertKeys(g, p, &c));
  if (!c.moe() || g.Has(p + "feed_forward_length")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_ff, GetPositiveInt(g, p + "feed_forward_length", 1 << 18));
  }
  if (c.moe()) {
    // The expert width: qwen3moe's own key, else (Mixtral) the FFN length, else llama.cpp's
    // fallback of the FFN length shared among the chosen experts.
    if (g.Has(p + "expert_feed_forward_length")) {
      TRELLIS_ASSIGN_OR_RETURN(c.n_ff_exp, GetPositiveInt(g, p + "expert_feed_forward_length", 1 << 18));
    } else if (c.n_ff > 0) {
      c.n_ff_exp = c.arch == "llama" ? c.n_ff : c.n_ff / c.n_expert_used;
    }
    if (c.n_ff_exp <= 0) {
      return InvalidArgument(fmt::format("{}: neither {}expert_feed_forward_length nor {}feed_forward_length gives "
                                         "the experts' width", c.arch, p, p));
    }
    if (c.arch == "qwen2moe") {  // the shared expert: its own key, else the FFN length
      if (g.Has(p + "expert_shared_feed_forward_length")) {
        TRELLIS_ASSIGN_OR_RETURN(c.n_ff_shexp, GetPositiveInt(g, p + "expert_shared_feed_forward_length", 1 << 18));
      } else {
        c.n_ff_shexp = c.n_ff;
      }
      if (c.n_ff_shexp <= 0) {
        return InvalidArgument(fmt::format("qwen2moe: neither {}expert_shared_feed_forward_length nor "
                                           "{}feed_forward_length gives the shared expert's width", p, p));
      }
    }
    c.n_ff = 0;  // every layer is a mixture: no dense FFN
  }
  TRELLIS_ASSIGN_OR_RETURN(c.n_head, GetPositiveInt(g, p + "attention.head_count", 1024));
  c.n_head_kv = c.n_head;
  if (g.Has(p + "attention.head_count_kv")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_head_kv, GetPositiveInt(g, p + "attention.head_count_kv", 1024));
  }
  c.n_ctx_train = 4096;
  if (g.Has(p + "context_length")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_ctx_train, GetPositiveInt(g, p + "context_length", 1 << 24));
  }
  if (c.n_head % c.n_head_kv != 0) {
    return InvalidArgument(fmt::format("head_count {} is not a multiple of head_count_kv {}", c.n_head, c.n_head_kv));
  }
  if (g.Has(p + "attention.key_length")) {
    TRELLIS_ASSIGN_OR_RETURN(c.head_dim, GetPositiveInt(g, p + "attention.key_length", 1024));
  } else if (c.n_embd % c.n_head != 0) {
    return InvalidArgument(fmt::format("embedding_length {} is not a multiple of head_count {}", c.n_embd, c.n_head));
  } else {
    c.head_dim = c.n_embd / c.n_head;
  }
  if (c.head_dim % 2 != 0) return InvalidArgument(fmt::format("head dim {} is odd (RoPE rotates pairs)", c.head_dim));
  if (g.Has(p + "attention.value_length")) {
    TRELLIS_ASSIGN_OR_RETURN(int v, GetPositiveInt(g, p + "attention.value_length", 1024));
    if (v != c.head_dim) {
      return Unsupported(fmt::format("attention.value_length {} differs from key_length {}", v, c.head_dim));
    }
  }
  c.n_rot = c.head_dim;
  if (g.Has(p + "rope.dimension_count")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_rot, GetPositiveInt(g, p + "rope.dimension_count", 1 << 16));
  }
  // Partial rotary (Phi-4-mini rotates 96 of 128 dims): the rest pass through unrotated.
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    return InvalidArgument(fmt::format("rope.dimension_count {} must be even and at most the head dim {}", c.n_rot, c.head_dim));
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
    } else if (type == "yarn") {
      TRELLIS_RETURN_IF_ERROR(ReadYarnKeys(g, p, &c));
    } else if (type != "none") {
      return Unsupported(fmt::format("rope scaling type '{}' (supported: none, linear, yarn, and llama3 via rope_freqs)", type));
    }
  } else if (g.Has(p + "rope.scale_linear")) {
    TRELLIS_ASSIGN_OR_RETURN(double f, g.GetFloat(p + "rope.scale_linear"));
    if (f > 0) c.rope_freq_scale = static_cast<float>(1.0 / f);
  }
  c.n_ctx_orig = c.n_ctx_train;
  if (g.Has(p + "rope.scaling.original_context_length")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_ctx_orig, GetPositiveInt(g, p + "rope.scaling.original_context_length", 1 << 24));
  }
  if (g.Has(p + "rope.scaling.attn_factor")) {
    TRELLIS_ASSIGN_OR_RETURN(double f, g.GetFloat(p + "rope.scaling.attn_factor"));
    if (!(f > 0 && f < 16)) return InvalidArgument(fmt::format("rope.scaling.attn_factor {} out of range (0, 16)", f));
    c.rope_attn_factor = static_cast<float>(f);
  }
  if (c.rope_yarn_ext_factor != 0.0f) {
    // llama.cpp's net magnitude for YaRN (llama-context.cpp: its yarn_attn_factor, then
    // rope_yarn's mscale): get_mscale(factor, 1) [/ get_mscale(factor, log_mul)].
    const float factor = 1.0f / c.rope_freq_scale;
    auto get_mscale = [](float scale, float mscale) { return scale <= 1.0f ? 1.0f : 0.1f * mscale * std::log(scale) + 1.0f; };
    float m = get_mscale(factor, 1.0f);
    if (g.Has(p + "rope.scaling.yarn_log_multiplier")) {
      TRELLIS_ASSIGN_OR_RETURN(double lm, g.GetFloat(p + "rope.scaling.yarn_log_multiplier"));
      if (!(lm >= 0 && lm < 100)) return InvalidArgument(fmt::format("rope.scaling.yarn_log_multiplier {} out of range [0, 100)", lm));
      if (lm != 0) m /= get_mscale(factor, static_cast<float>(lm));
    }
    c.rope_attn_factor *= m;
  }
  if (g.Has(p + "attention.layer_norm_rms_epsilon")) {
    TRELLIS_ASSIGN_OR_RETURN(double e, g.GetFloat(p + "attention.layer_norm_rms_epsilon"));
    if (!(e > 0 && e < 1)) return InvalidArgument(fmt::format("layer_norm_rms_epsilon {} out of range", e));
    c.rms_eps = static_cast<float>(e);
  }
  if (c.post_norms) {
    TRELLIS_RETURN_IF_ERROR(ReadGemmaKeys(g, p, &c));
  }
  // The vocab size comes from the token list when the key is absent.
  if (g.Has(p + "vocab_size")) {
    TRELLIS_ASSIGN_OR_RETURN(c.n_vocab, GetPositiveInt(g, p + "vocab_size", 1 << 22));
  } else if (auto toks = g.GetArray("tokenizer.ggml.tokens", GgufValueType::kString); toks.ok()) {
    c.n_vocab = static_cast<int>((*toks)->count);
  } else {
    return InvalidArgument(fmt::format("neither {}vocab_size nor tokenizer.ggml.tokens is present", p));
  }
  return c;
}

}  // namespace trellis
