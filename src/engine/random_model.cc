#include "engine/random_model.h"

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "kernels/quant.h"
#include "model/gguf_writer.h"

namespace trellis {
namespace {

struct TypeChoice {
  GgmlType main, output, more_bits;  // more_bits: attn_v / ffn_down in favoured layers
};

Result<TypeChoice> ParseType(const std::string& t, bool pure) {
  if (t == "f32") return TypeChoice{GgmlType::kF32, GgmlType::kF32, GgmlType::kF32};
  if (t == "f16") return TypeChoice{GgmlType::kF16, GgmlType::kF16, GgmlType::kF16};
  if (t == "bf16") return TypeChoice{GgmlType::kBF16, GgmlType::kBF16, GgmlType::kBF16};
  if (t == "q8_0") return TypeChoice{GgmlType::kQ8_0, GgmlType::kQ8_0, GgmlType::kQ8_0};
  if (t == "q6_k") return TypeChoice{GgmlType::kQ6_K, GgmlType::kQ6_K, GgmlType::kQ6_K};
  if (t == "q4_0") return TypeChoice{GgmlType::kQ4_0, pure ? GgmlType::kQ4_0 : GgmlType::kQ6_K, GgmlType::kQ4_0};
  if (t == "q4_k_m") {
    return TypeChoice{GgmlType::kQ4_K, pure ? GgmlType::kQ4_K : GgmlType::kQ6_K,
                      pure ? GgmlType::kQ4_K : GgmlType::kQ6_K};
  }
  if (t == "q5_k_m") {
    return TypeChoice{GgmlType::kQ5_K, pure ? GgmlType::kQ5_K : GgmlType::kQ6_K,
                      pure ? GgmlType::kQ5_K : GgmlType::kQ6_K};
  }
  return InvalidArgument(fmt::format("unknown model type '{}' (f32, f16, bf16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k)", t));
}

// llama.cpp's Q4_K_M / Q5_K_M rule for which layers' attn_v / ffn_down get more bits.
bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// SplitMix64: a fast, well-mixed stream per (seed, tensor, row).
uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fills rows x cols of uniform values with standard deviation `stddev`, quantized to
// `type`, in parallel over rows.
Status FillRandom(std::span<uint8_t> dst, GgmlType type, int64_t rows, int64_t cols, float stddev,
                  uint64_t seed, int n_threads) {
  const int64_t row_bytes = RowBytes(type, cols);
  if (static_cast<int64_t>(dst.size()) != rows * row_bytes) return Internal("random tensor size mismatch");
  const float a = stddev * std::sqrt(3.0f);
  std::vector<Status> errs(static_cast<size_t>(n_threads));
  std::vector<std::thread> ts;
  for (int t = 0; t < n_threads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = rows * t / n_threads; r < rows * (t + 1) / n_threads; ++r) {
        uint64_t s = seed * 0x100000001b3ull + static_cast<uint64_t>(r);
        for (int64_t c = 0; c < cols; ++c) {
          const double u = static_cast<double>(SplitMix(s) >> 11) * (1.0 / 9007199254740992.0);
          row[static_cast<size_t>(c)] = static_cast<float>((2.0 * u - 1.0) * a);
        }
        Status st = QuantizeRow(type, row.data(), dst.data() + r * row_bytes, cols);
        if (!st.ok()) {
          errs[static_cast<size_t>(t)] = st;
          return;
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  for (Status& s : errs) TRELLIS_RETURN_IF_ERROR(s);
  return Status::Ok();
}

// Llama 3's rope_freqs: the factor theta_i is divided by, from the converter's formula
// (factor 32, low_freq_factor 1, high_freq_factor 4, original context 8192).
std::vector<float> Llama3RopeFactors(int head_dim, float theta) {
  constexpr double kFactor = 32, kLow = 1, kHigh = 4, kOrig = 8192;
  std::vector<float> f;
  for (int i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(static_cast<double>(theta), static_cast<double>(i) / head_dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < kOrig / kHigh) {
      f.push_back(1.0f);
    } else if (wavelen > kOrig / kLow) {
      f.push_back(static_cast<float>(kFactor));
    } else {
      const double smooth = (kOrig / wavelen - kLow) / (kHigh - kLow);
      f.push_back(static_cast<float>(1.0 / ((1 - smooth) / kFactor + smooth)));
    }
  }
  return f;
}

}  // namespace

Result<ModelShape> ModelShapeByName(const std::string& name) {
  if (name == "tinyllama") return ModelShape{"tinyllama", 22, 2048, 32, 4, 5632, 2048, 10000.0f, 1e-5f};
  if (name == "tiny") return ModelShape{"tiny", 4, 256, 4, 2, 768, 2048, 10000.0f, 1e-5f};
  if (name == "ptstore") return ModelShape{"ptstore", 4, 1024, 16, 16, 2816, 16384, 10000.0f, 1e-5f};
  if (name == "ref-a") return ModelShape{"ref-a", 2, 256, 4, 2, 768, 2048, 10000.0f, 1e-5f};
  // The unit tests' models (test_models.cc WriteSmallModel): 256 wide so every quantized
  // type (256-element super-blocks) fits.
  if (name == "small") return ModelShape{"small", 2, 256, 4, 2, 512, 512, 10000.0f, 1e-5f};
  if (name == "moe-tiny") {
    ModelShape s{"moe-tiny", 2, 256, 4, 2, 256, 2048, 10000.0f, 1e-5f};
    s.n_expert = 8;
    s.n_expert_used = 2;
    return s;
  }
  if (name == "qwen3-30b-a3b") {
    ModelShape s{"qwen3-30b-a3b", 48, 2048, 32, 4, 768, 4096, 1000000.0f, 1e-6f, 128};
    s.n_expert = 128;
    s.n_expert_used = 8;
    return s;
  }
  if (name == "mixtral-small") {
    ModelShape s{"mixtral-small", 16, 2048, 32, 8, 5632, 4096, 1000000.0f, 1e-5f};
    s.n_expert = 8;
    s.n_expert_used = 2;
    return s;
  }
  return InvalidArgument(fmt::format("unknown model shape '{}' (tinyllama, tiny, ptstore, ref-a, small, moe-tiny, "
                                     "qwen3-30b-a3b, mixtral-small)", name));
}

Status WriteRandomModel(const RandomModelOptions& o, const GgufFile& vocab, const std::string& path) {
  TRELLIS_ASSIGN_OR_RETURN(TypeChoice tc, ParseType(o.type, o.pure));
  TRELLIS_ASSIGN_OR_RETURN(const GgufValue* tokens, vocab.GetArray("tokenizer.ggml.tokens", GgufValueType::kString));
  const ModelShape& s = o.shape;
  const int n_vocab = static_cast<int>(tokens->count);
  const int64_t q_dim = static_cast<int64_t>(s.n_head) * (s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head);
  for (GgmlType t : {tc.main, tc.output, tc.more_bits}) {
    const int64_t be = GetGgmlTypeTraits(t).block_elems;
    if (s.n_embd % be || s.n_ff % be || q_dim % be) {
      return InvalidArgument(fmt::format("shape {} does not fit {} blocks of {}", s.name, GetGgmlTypeTraits(t).name, be));
    }
  }

  const std::string& arch = o.arch;
  if (arch != "llama" && arch != "llama3.2" && arch != "qwen2" && arch != "qwen3" && arch != "phi3" &&
      arch != "gemma2" && arch != "gemma3" && arch != "qwen3moe" && arch != "mixtral" && arch != "qwen2moe") {
    return InvalidArgument(fmt::format("unknown architecture '{}' (llama, llama3.2, qwen2, qwen3, phi3, gemma2, gemma3, "
                                       "qwen3moe, mixtral, qwen2moe)", arch));
  }
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  const bool moe = arch == "qwen3moe" || arch == "mixtral" || arch == "qwen2moe";
  if (moe != (s.n_expert > 0)) {
    return InvalidArgument(moe ? fmt::format("architecture {} needs a mixture shape (moe-tiny, qwen3-30b-a3b, mixtral-small)", arch)
                               : fmt::format("shape {} is a mixture of experts: use --arch qwen3moe, mixtral or qwen2moe", s.name));
  }
  const std::string gguf_arch = arch == "llama3.2" || arch == "mixtral" ? "llama" : arch;
  const int head_dim = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;
  if (head_dim % 2 != 0 || (s.head_dim == 0 && s.n_embd % s.n_head != 0)) {
    return InvalidArgument(fmt::format("shape {}: head dim {} does not divide evenly", s.name, head_dim));
  }

  GgufWriter w;
  const std::string k = gguf_arch + ".";
  w.SetString("general.architecture", gguf_arch);
  // Not the architecture: llama.cpp keys tokenizer quirks on names containing "phi3".
  w.SetString("general.name", fmt::format("trellis-random-{}-{}", s.name, o.type));
  w.SetUint32(k + "vocab_size", static_cast<uint32_t>(n_vocab));
  w.SetUint32(k + "context_length", static_cast<uint32_t>(s.n_ctx));
  w.SetUint32(k + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w.SetUint32(k + "block_count", static_cast<uint32_t>(s.n_layer));
  w.SetUint32(k + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
  if (moe) {
    w.SetUint32(k + "expert_count", static_cast<uint32_t>(s.n_expert));
    w.SetUint32(k + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
    if (arch != "mixtral") w.SetUint32(k + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff));
    if (arch == "qwen2moe") w.SetUint32(k + "expert_shared_feed_forward_length", static_cast<uint32_t>(2 * s.n_ff));
  }
  w.SetUint32(k + "attention.head_count", static_cast<uint32_t>(s.n_head));
  w.SetUint32(k + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  if (s.head_dim > 0) {
    w.SetUint32(k + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.SetUint32(k + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  const int n_rot = s.n_rot > 0 ? s.n_rot : head_dim;
  if (n_rot > head_dim || n_rot % 2 != 0) return InvalidArgument(fmt::format("rotated dims {} do not fit head dim {}", n_rot, head_dim));
  w.SetUint32(k + "rope.dimension_count", static_cast<uint32_t>(n_rot));
  if (arch == "phi3") {
    w.SetFloat32(k + "rope.scaling.attn_factor", 1.19f);
    w.SetUint32(k + "rope.scaling.original_context_length", 256);
  }
  if (gemma) {
    w.SetUint32(k + "attention.sliding_window", 48);
    w.SetFloat32(k + "final_logit_softcapping", 3.0f);
    if (arch == "gemma2") w.SetFloat32(k + "attn_logit_softcapping", 4.0f);
    if (arch == "gemma3") {
      w.SetUint32(k + "attention.sliding_window_pattern", 2);
      w.SetFloat32(k + "rope.freq_base_swa", 10000.0f);
      w.SetString(k + "rope.scaling.type", "linear");
      w.SetFloat32(k + "rope.scaling.factor", 8.0f);
    }
  }
  if (o.yarn_factor > 0) {
    if (o.yarn_orig_ctx <= 0 || gemma || arch == "phi3" || arch == "llama3.2") {
      return InvalidArgument("YaRN needs an original context (and a family without its own rope scaling)");
    }
    w.SetString(k + "rope.scaling.type", "yarn");
    w.SetFloat32(k + "rope.scaling.factor", o.yarn_factor);
    w.SetUint32(k + "rope.scaling.original_context_length", static_cast<uint32_t>(o.yarn_orig_ctx));
  }
  w.SetFloat32(k + "rope.freq_base", s.rope_theta);
  w.SetFloat32(k + "attention.layer_norm_rms_epsilon", s.rms_eps);
  for (const auto& [key, value] : vocab.metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) w.SetValue(key, value);
  }
  w.SetUint32("general.quantization_version", 2);
  // llama.cpp's file-type code (enum llama_ftype), so tools name the mix instead of guessing.
  const uint32_t ftype = o.type == "f32" ? 0 : o.type == "f16" ? 1 : o.type == "q4_0" ? 2 : o.type == "q8_0" ? 7
                       : o.type == "q4_k_m" ? 15 : o.type == "q5_k_m" ? 17 : o.type == "q6_k" ? 18 : o.type == "bf16" ? 32 : 0;
  w.SetUint32("general.file_type", ftype);

  uint64_t tensor_seed = o.seed;
  // A matrix of `count` stacked (cols, rows) matrices ({cols, rows, count} for experts).
  auto add_matrices = [&](const std::string& name, int64_t cols, int64_t rows, int64_t count, GgmlType type,
                          float gain = 1.0f) -> Status {
    const uint64_t seed = ++tensor_seed * 0x9e3779b97f4a7c15ull;
    const float stddev = gain / std::sqrt(static_cast<float>(cols));
    const int threads = o.n_threads;
    std::vector<int64_t> dims = {cols, rows};
    if (count > 1) dims.push_back(count);
    return w.AddTensor(name, dims, type, [=](std::span<uint8_t> dst) {
      return FillRandom(dst, type, rows * count, cols, stddev, seed, threads);
    });
  };
  auto add_matrix = [&](const std::string& name, int64_t cols, int64_t rows, GgmlType type) -> Status {
    return add_matrices(name, cols, rows, 1, type);
  };
  auto add_ones = [&](const std::string& name, int64_t n) -> Status {
    return w.AddTensor(name, {n}, GgmlType::kF32, [n](std::span<uint8_t> dst) {
      std::vector<float> ones(static_cast<size_t>(n), 1.0f);
      std::memcpy(dst.data(), ones.data(), dst.size());
      return Status::Ok();
    });
  };
  // f32 vectors of uniform values in [center - half, center + half].
  auto add_vector = [&](const std::string& name, int64_t n, float center, float half) -> Status {
    const uint64_t seed = ++tensor_seed * 0x9e3779b97f4a7c15ull;
    return w.AddTensor(name, {n}, GgmlType::kF32, [=](std::span<uint8_t> dst) {
      std::vector<float> v(static_cast<size_t>(n));
      uint64_t st = seed;
      for (float& x : v) {
        const double u = static_cast<double>(SplitMix(st) >> 11) * (1.0 / 9007199254740992.0);
        x = center + static_cast<float>((2.0 * u - 1.0) * half);
      }
      std::memcpy(dst.data(), v.data(), dst.size());
      return Status::Ok();
    });
  };
  const int64_t E = s.n_embd, F = s.n_ff, D = head_dim;
  const int64_t QD = static_cast<int64_t>(s.n_head) * D, KD = static_cast<int64_t>(s.n_head_kv) * D;
  // Embeddings get unit-scale rows, as trained embeddings roughly have.
  TRELLIS_RETURN_IF_ERROR(w.AddTensor("token_embd.weight", {E, n_vocab}, tc.main, [&, seed = o.seed](std::span<uint8_t> dst) {
    // Gemma scales the input by sqrt(n_embd) and ties the output: rows of norm ~1, as
    // its trained embeddings have, keep both the input and the logits at unit scale.
    return FillRandom(dst, tc.main, n_vocab, E, gemma ? 1.0f / std::sqrt(static_cast<float>(E)) : 1.0f, seed ^ 0xE1,
                      o.n_threads);
  }));
  TRELLIS_RETURN_IF_ERROR(add_ones("output_norm.weight", E));
  if (arch == "phi3") {
    TRELLIS_RETURN_IF_ERROR(add_vector("rope_factors_long.weight", n_rot / 2, 4.5f, 3.5f));
    TRELLIS_RETURN_IF_ERROR(add_vector("rope_factors_short.weight", n_rot / 2, 1.25f, 0.25f));
  }
  if (arch == "llama3.2") {
    const std::vector<float> f = Llama3RopeFactors(n_rot, s.rope_theta);
    TRELLIS_RETURN_IF_ERROR(w.AddTensor("rope_freqs.weight", {n_rot / 2}, GgmlType::kF32, [f](std::span<uint8_t> dst) {
      std::memcpy(dst.data(), f.data(), dst.size());
      return Status::Ok();
    }));
  } else if (!gemma) {  // Gemma and Llama 3.2 tie the output to the embeddings
    TRELLIS_RETURN_IF_ERROR(add_matrix("output.weight", E, n_vocab, tc.output));
  }
  for (int i = 0; i < s.n_layer; ++i) {
    const std::string p = fmt::format("blk.{}.", i);
    const GgmlType vt = UseMoreBits(i, s.n_layer) ? tc.more_bits : tc.main;
    TRELLIS_RETURN_IF_ERROR(add_ones(p + "attn_norm.weight", E));
    if (arch == "phi3") {
      TRELLIS_RETURN_IF_ERROR(add_matrix(p + "attn_qkv.weight", E, QD + 2 * KD, tc.main));
    } else {
      TRELLIS_RETURN_IF_ERROR(add_matrix(p + "attn_q.weight", E, QD, tc.main));
      TRELLIS_RETURN_IF_ERROR(add_matrix(p + "attn_k.weight", E, KD, tc.main));
      TRELLIS_RETURN_IF_ERROR(add_matrix(p + "attn_v.weight", E, KD, vt));
    }
    if (arch == "qwen2" || arch == "qwen2moe") {
      TRELLIS_RETURN_IF_ERROR(add_vector(p + "attn_q.bias", QD, 0.0f, 0.5f * std::sqrt(3.0f)));
      TRELLIS_RETURN_IF_ERROR(add_vector(p + "attn_k.bias", KD, 0.0f, 0.5f * std::sqrt(3.0f)));
      TRELLIS_RETURN_IF_ERROR(add_vector(p + "attn_v.bias", KD, 0.0f, 0.5f * std::sqrt(3.0f)));
    }
    if (arch == "qwen3" || arch == "gemma3" || arch == "qwen3moe") {
      TRELLIS_RETURN_IF_ERROR(add_vector(p + "attn_q_norm.weight", D, 1.0f, 0.5f));
      TRELLIS_RETURN_IF_ERROR(add_vector(p + "attn_k_norm.weight", D, 1.0f, 0.5f));
    }
    TRELLIS_RETURN_IF_ERROR(add_matrix(p + "attn_output.weight", QD, E, tc.main));
    if (gemma) {
      TRELLIS_RETURN_IF_ERROR(add_vector(p + "post_attention_norm.weight", E, 1.0f, 0.5f));
      TRELLIS_RETURN_IF_ERROR(add_vector(p + "post_ffw_norm.weight", E, 1.0f, 0.5f));
    }
    TRELLIS_RETURN_IF_ERROR(add_ones(p + "ffn_norm.weight", E));
    if (moe) {
      TRELLIS_RETURN_IF_ERROR(add_matrices(p + "ffn_gate_inp.weight", E, s.n_expert, 1, GgmlType::kF32, 3.0f));
      TRELLIS_RETURN_IF_ERROR(add_matrices(p + "ffn_gate_exps.weight", E, F, s.n_expert, tc.main));
      TRELLIS_RETURN_IF_ERROR(add_matrices(p + "ffn_up_exps.weight", E, F, s.n_expert, tc.main));
      TRELLIS_RETURN_IF_ERROR(add_matrices(p + "ffn_down_exps.weight", F, E, s.n_expert, vt));
      if (arch == "qwen2moe") {
        // The shared expert, twice an expert's width, and its gate (a vector, f32: gate
        // logits of std ~2, so the sigmoid ranges over most of (0, 1)).
        TRELLIS_RETURN_IF_ERROR(add_vector(p + "ffn_gate_inp_shexp.weight", E, 0.0f, 2.0f * std::sqrt(3.0f / E)));
        TRELLIS_RETURN_IF_ERROR(add_matrix(p + "ffn_gate_shexp.weight", E, 2 * F, tc.main));
        TRELLIS_RETURN_IF_ERROR(add_matrix(p + "ffn_up_shexp.weight", E, 2 * F, tc.main));
        TRELLIS_RETURN_IF_ERROR(add_matrix(p + "ffn_down_shexp.weight", 2 * F, E, vt));
      }
      continue;
    }
    if (arch == "phi3") {
      TRELLIS_RETURN_IF_ERROR(add_matrix(p + "ffn_up.weight", E, 2 * F, tc.main));
    } else {
      TRELLIS_RETURN_IF_ERROR(add_matrix(p + "ffn_gate.weight", E, F, tc.main));
      TRELLIS_RETURN_IF_ERROR(add_matrix(p + "ffn_up.weight", E, F, tc.main));
    }
    TRELLIS_RETURN_IF_ERROR(add_matrix(p + "ffn_down.weight", F, E, vt));
  }
  return w.WriteFile(path);
}

}  // namespace trellis
