// Model loading: every supported variant loads, every broken file is refused with a
// message naming what is wrong.
#include "engine/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "engine/run_one.h"
#include "engine/test_models.h"
#include "model/tokenizer.h"

namespace trellis {
namespace {

using testing::RewriteGguf;
using testing::RewriteHooks;
using testing::TempPath;
using testing::WriteSmallModel;

void ExpectLoadError(const std::string& path, StatusCode code, const std::string& needle) {
  auto m = Model::Load(path);
  ASSERT_FALSE(m.ok()) << "loaded " << path;
  EXPECT_EQ(m.status().code(), code) << m.status().ToString();
  EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().ToString();
}

// One session alone on a Scheduler (the production driver): `n` greedy tokens, or with
// n == 0 the logits of every prompt position (a context of n_ctx; 0: the model's).
Result<OneRun> RunAlone(const Model& m, const std::vector<int32_t>& prompt, int n, int n_ctx = 0) {
  ThreadPool pool(2);
  SchedulerOptions so;
  so.n_ctx = n_ctx;
  so.prompt_logits = n == 0;
  TRELLIS_ASSIGN_OR_RETURN(auto s, Scheduler::Create(m, so, pool));
  Request r;
  r.prompt = prompt;
  r.max_tokens = std::max(n, 1);
  r.prompt_logits = n == 0;
  r.sampling.temperature = 0;
  return RunOne(*s, r);
}

std::vector<int32_t> Greedy(const Model& m, const std::vector<int32_t>& prompt, int n) {
  auto res = RunAlone(m, prompt, n);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return res.ok() ? res->result.tokens : std::vector<int32_t>{};
}

std::vector<float> PromptLogits(const Model& m, const std::vector<int32_t>& prompt, int n_ctx = 0) {
  auto res = RunAlone(m, prompt, 0, n_ctx);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return res.ok() ? res->result.prompt_logits : std::vector<float>{};
}

TEST(ModelTest, EveryWeightTypeLoadsAndRuns) {
  for (const char* type : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"}) {
    const std::string path = WriteSmallModel(std::string("m_") + type + ".gguf", type);
    auto m = Model::Load(path);
    ASSERT_TRUE(m.ok()) << type << ": " << m.status().ToString();
    EXPECT_EQ((*m)->config().n_layer, 2);
    EXPECT_EQ(Greedy(**m, {1, 5, 9}, 4).size(), 4u) << type;
  }
}

TEST(ModelTest, EveryArchitectureLoadsAndRuns) {
  for (const std::string arch : {"llama", "llama3.2", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"}) {
    const std::string path = WriteSmallModel("a_" + arch + ".gguf", "q8_0", "", arch);
    auto m = Model::Load(path);
    ASSERT_TRUE(m.ok()) << arch << ": " << m.status().ToString();
    const ModelConfig& c = (*m)->config();
    const bool gemma = arch.rfind("gemma", 0) == 0;
    EXPECT_EQ(c.arch, arch == "llama3.2" ? "llama" : arch);
    EXPECT_EQ(c.rope_neox, arch.rfind("llama", 0) != 0) << arch;
    EXPECT_EQ(c.qk_norm, arch == "qwen3" || arch == "gemma3") << arch;
    EXPECT_EQ(c.head_dim, arch == "qwen3" ? 128 : 64) << arch;
    EXPECT_EQ((*m)->tied_output(), arch == "llama3.2" || gemma) << arch;
    EXPECT_EQ(c.post_norms, gemma) << arch;
    EXPECT_EQ(c.ffn_gelu, gemma) << arch;
    EXPECT_EQ(c.IsSwaLayer(0), gemma) << arch;  // gemma2: 0 slides, 1 global; gemma3 (pattern 2): the same
    EXPECT_FALSE(c.IsSwaLayer(1)) << arch;
    EXPECT_EQ(c.attn_softcap, arch == "gemma2" ? 4.0f : 0.0f) << arch;
    EXPECT_EQ(c.final_softcap, gemma ? 3.0f : 0.0f) << arch;
    EXPECT_EQ((*m)->layer(0).bq.empty(), std::string(arch) != "qwen2") << arch;
    EXPECT_EQ(Greedy(**m, {1, 5, 9}, 4).size(), 4u) << arch;
  }
}

// Phi-3's LongRoPE: the short factors up to the original context, the long ones beyond
// (as llama.cpp chooses, by the context size), and K/V of the two never share a name.
TEST(ModelTest, LongRopeFactorsFollowTheContextSize) {
  const std::string path = WriteSmallModel("phi3_rope.gguf", "f16", "", "phi3");
  auto m = Model::Load(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.n_ctx_orig, 256);
  EXPECT_FLOAT_EQ(c.rope_attn_factor, 1.19f);
  const float* shrt = (*m)->RopeFactors(256);
  const float* lng = (*m)->RopeFactors(257);
  ASSERT_NE(shrt, nullptr);
  ASSERT_NE(lng, nullptr);
  EXPECT_NE(shrt, lng);
  EXPECT_EQ((*m)->KvFingerprint(100), (*m)->fingerprint());
  EXPECT_NE((*m)->KvFingerprint(4096), (*m)->fingerprint());
  // The factor set changes the computation.
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> at200 = PromptLogits(**m, prompt, 200), at400 = PromptLogits(**m, prompt, 400);
  ASSERT_FALSE(at200.empty());
  EXPECT_NE(at200, at400);
}

// The same tensors under two architectures compute different K/V (here: NeoX against
// llama RoPE), so the fingerprint that keys the shared prefix store must differ.
TEST(ModelTest, ArchitectureIsPartOfTheFingerprint) {
  const std::string src = WriteSmallModel("fp_q2.gguf", "f16", "", "qwen2");
  const std::string q2 = TempPath("fp_q2_nobias.gguf"), ll = TempPath("fp_llama.gguf");
  auto no_bias = [](GgufTensorInfo& t) { return t.name.find(".bias") == std::string::npos; };
  RewriteGguf(src, q2, {.tensor = no_bias});
  std::vector<std::pair<std::string, GgufValue>> renamed;
  RewriteGguf(src, ll, {.metadata =
                            [&](const std::string& k, GgufValue& v) {
                              if (k == "general.architecture") v.str = "llama";
                              if (k.rfind("qwen2.", 0) != 0) return true;
                              renamed.emplace_back("llama." + k.substr(6), v);
                              return false;
                            },
                        .tensor = no_bias,
                        .extra = [&](GgufWriter& w) {
                          for (const auto& [k, v] : renamed) w.SetValue(k, v);
                        }});
  auto a = Model::Load(q2);
  auto b = Model::Load(ll);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->config().arch, "llama");
  EXPECT_NE((*a)->fingerprint(), (*b)->fingerprint());
  EXPECT_NE(Greedy(**a, {1, 5, 9, 200, 17, 3}, 6), Greedy(**b, {1, 5, 9, 200, 17, 3}, 6));
}

// Mixture-of-experts files are refused by name (docs/moe.md): a Mixtral is a "llama" file
// with expert keys (not a dense llama missing its FFN), and the MoE architectures say so.
// Mixtures of experts: qwen3moe, Mixtral and qwen2moe load (their logits:
// reference_test.cc); gpt-oss is refused by name, and bad expert keys and tensors are named.
// YaRN's keys: read as llama.cpp reads them (its answers: reference_test's
// ref-qwen2yarn-f16), out-of-range values named, other scaling types refused by name.
TEST(ModelTest, YarnKeysAreReadAndChecked) {
  const std::string src = WriteSmallModel("yarn_src.gguf");
  auto with = [&](const std::string& name, std::function<void(GgufWriter&)> extra) {
    const std::string dst = TempPath(name);
    RewriteGguf(src, dst, {.extra = std::move(extra)});
    return dst;
  };
  auto yarn = [](float factor) {
    return [factor](GgufWriter& w) {
      w.SetString("llama.rope.scaling.type", "yarn");
      w.SetFloat32("llama.rope.scaling.factor", factor);
      w.SetUint32("llama.rope.scaling.original_context_length", 128);
    };
  };
  auto m = Model::Load(with("yarn_ok.gguf", yarn(4.0f)));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  EXPECT_FLOAT_EQ(c.rope_freq_scale, 0.25f);
  EXPECT_FLOAT_EQ(c.rope_yarn_ext_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope_yarn_beta_fast, 32.0f);
  EXPECT_FLOAT_EQ(c.rope_yarn_beta_slow, 1.0f);
  EXPECT_EQ(c.n_ctx_orig, 128);
  EXPECT_NEAR(c.rope_attn_factor, 1.0 + 0.1 * std::log(4.0), 1e-6);  // llama.cpp's net magnitude
  auto deepseek = Model::Load(with("yarn_log_mul.gguf", [&](GgufWriter& w) {
    yarn(4.0f)(w);
    w.SetFloat32("llama.rope.scaling.yarn_log_multiplier", 0.1f);
    w.SetFloat32("llama.rope.scaling.yarn_beta_fast", 16.0f);
  }));
  ASSERT_TRUE(deepseek.ok()) << deepseek.status().ToString();
  EXPECT_NEAR((*deepseek)->config().rope_attn_factor, (1.0 + 0.1 * std::log(4.0)) / (1.0 + 0.01 * std::log(4.0)), 1e-6);
  EXPECT_FLOAT_EQ((*deepseek)->config().rope_yarn_beta_fast, 16.0f);
  ExpectLoadError(with("yarn_bad.gguf", yarn(-2.0f)), StatusCode::kInvalidArgument, "rope.scaling.factor -2");
  ExpectLoadError(with("yarn_ext.gguf", [&](GgufWriter& w) {
                    yarn(4.0f)(w);
                    w.SetFloat32("llama.rope.scaling.yarn_ext_factor", 3.0f);
                  }),
                  StatusCode::kInvalidArgument, "yarn_ext_factor 3 above 1");
  ExpectLoadError(with("longrope.gguf", [](GgufWriter& w) { w.SetString("llama.rope.scaling.type", "longrope"); }),
                  StatusCode::kUnsupported, "rope scaling type 'longrope'");
}

TEST(ModelTest, MixtureOfExpertsFilesAreChecked) {
  const std::string src = WriteSmallModel("moe_src.gguf");
  // A llama file that says it has experts but holds a dense FFN: the router is missing.
  const std::string mixtral = TempPath("moe_mixtral.gguf");
  RewriteGguf(src, mixtral, {.extra = [](GgufWriter& w) {
                               w.SetUint32("llama.expert_count", 8);
                               w.SetUint32("llama.expert_used_count", 2);
                             }});
  ExpectLoadError(mixtral, StatusCode::kNotFound, "blk.0.ffn_gate_inp.weight");
  const std::string oss = TempPath("moe_oss.gguf");
  RewriteGguf(src, oss, {.metadata = [](const std::string& k, GgufValue& v) {
                           if (k == "general.architecture") v.str = "gpt-oss";
                           return true;
                         }});
  ExpectLoadError(oss, StatusCode::kUnsupported, "'gpt-oss' is a mixture-of-experts architecture");

  // A moe-tiny model of `arch` in q8_0.
  auto write_moe = [](const std::string& name, const std::string& arch) {
    auto vocab = GgufFile::Open(std::string(TRELLIS_TEST_DATA) + "/reference/ref-a-f16.gguf");
    EXPECT_TRUE(vocab.ok());
    RandomModelOptions o;
    o.shape = *ModelShapeByName("moe-tiny");
    o.arch = arch;
    o.type = "q8_0";
    const std::string path = TempPath(name);
    EXPECT_TRUE(WriteRandomModel(o, *vocab, path).ok());
    return path;
  };
  const std::string moe = write_moe("moe_ok.gguf", "qwen3moe");
  {
    auto m = Model::Load(moe);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const ModelConfig& c = (*m)->config();
    EXPECT_EQ(c.n_expert, 8);
    EXPECT_EQ(c.n_expert_used, 2);
    EXPECT_EQ(c.n_ff_exp, 256);
    EXPECT_TRUE(c.expert_renorm);
    ASSERT_EQ((*m)->layer(1).exp_down.size(), 8u);
    // Expert e's matrix starts e * rows * row_bytes into the 3-D tensor.
    const GgufTensorInfo* t = (*m)->gguf().FindTensor("blk.1.ffn_down_exps.weight");
    const WeightMatrix& d5 = (*m)->layer(1).exp_down[5];
    EXPECT_EQ(static_cast<const uint8_t*>(d5.data), t->data + 5 * d5.rows * d5.row_bytes);
    // A token's decode step reads 2 of the 8 experts.
    EXPECT_LT((*m)->ActiveWeightBytes(), (*m)->WeightBytes() / 2);
    // Its arithmetic, from the shape: per layer q, k, v, o, the router and 2 experts' gate,
    // up and down; then the output head.
    const int64_t E = c.n_embd, Q = static_cast<int64_t>(c.n_head) * c.head_dim,
                  KV = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
    const int64_t per_layer = 2 * E * Q + 2 * E * KV + E * c.n_expert + 2 * 3 * E * c.n_ff_exp;
    EXPECT_EQ((*m)->ActiveMacsPerToken(), c.n_layer * per_layer + E * c.n_vocab);
  }
  auto with_key = [&](const char* name, const char* key, uint64_t value) {
    const std::string path = TempPath(name);
    RewriteGguf(moe, path, {.metadata = [=](const std::string& k, GgufValue& v) {
                              if (k == key) v.u64 = v.i64 = value;
                              return true;
                            }});
    return path;
  };
  ExpectLoadError(with_key("moe_used.gguf", "qwen3moe.expert_used_count", 9), StatusCode::kInvalidArgument,
                  "expert_used_count 9 exceeds expert_count 8");
  ExpectLoadError(with_key("moe_many.gguf", "qwen3moe.expert_count", 5000), StatusCode::kInvalidArgument,
                  "qwen3moe.expert_count");
  // Another expert count than the tensors hold: the shape is named.
  ExpectLoadError(with_key("moe_count.gguf", "qwen3moe.expert_count", 4), StatusCode::kInvalidArgument,
                  "blk.0.ffn_gate_inp.weight");
  ExpectLoadError(with_key("moe_width.gguf", "qwen3moe.expert_feed_forward_length", 128), StatusCode::kInvalidArgument,
                  "blk.0.ffn_gate_exps.weight");
  // qwen2moe's shared expert gate is a vector of n_embd.
  const std::string q2 = write_moe("moe_q2.gguf", "qwen2moe");
  {
    auto m = Model::Load(q2);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->config().n_ff_shexp, 512);
    EXPECT_FALSE((*m)->config().expert_renorm);
  }
  const std::string q2_bad = TempPath("moe_q2_bad.gguf");
  RewriteGguf(q2, q2_bad, {.tensor = [](GgufTensorInfo& t) {
                             if (t.name == "blk.1.ffn_gate_inp_shexp.weight") t.dims = {128, 2};
                             return true;
                           }});
  ExpectLoadError(q2_bad, StatusCode::kInvalidArgument, "blk.1.ffn_gate_inp_shexp.weight");
  // Old Mixtral conversions (one tensor per expert) are refused as such.
  const std::string old = TempPath("moe_old.gguf");
  RewriteGguf(moe, old, {.extra = [](GgufWriter& w) {
                           std::vector<float> b(256 * 256, 0.0f);
                           ASSERT_TRUE(w.AddTensorData("blk.0.ffn_gate.0.weight", {256, 256}, GgmlType::kF32,
                                                       {reinterpret_cast<const uint8_t*>(b.data()), b.size() * 4})
                                           .ok());
                         }});
  ExpectLoadError(old, StatusCode::kUnsupported, "old Mixtral conversion");
}

TEST(ModelTest, ArchitectureTensorsAreChecked) {
  // Qwen3 without its Q norm, and Qwen2 with a bias of the wrong length.
  const std::string q3 = WriteSmallModel("chk_q3.gguf", "f16", "", "qwen3");
  const std::string q3_bad = TempPath("chk_q3_bad.gguf");
  RewriteGguf(q3, q3_bad, {.tensor = [](GgufTensorInfo& t) { return t.name != "blk.1.attn_q_norm.weight"; }});
  ExpectLoadError(q3_bad, StatusCode::kNotFound, "blk.1.attn_q_norm.weight");
  const std::string q2 = WriteSmallModel("chk_q2.gguf", "f16", "", "qwen2");
  const std::string q2_bad = TempPath("chk_q2_bad.gguf");
  RewriteGguf(q2, q2_bad, {.tensor = [](GgufTensorInfo& t) { return t.name != "blk.0.attn_k.bias"; },
                           .extra = [](GgufWriter& w) {
                             std::vector<float> b(100, 0.0f);
                             ASSERT_TRUE(w.AddTensorData("blk.0.attn_k.bias", {100}, GgmlType::kF32,
                                                         {reinterpret_cast<const uint8_t*>(b.data()), b.size() * 4})
                                             .ok());
                           }});
  ExpectLoadError(q2_bad, StatusCode::kInvalidArgument, "blk.0.attn_k.bias");
  // key_length and value_length must agree (MLA-style models are not supported).
  const std::string q3_kv = TempPath("chk_q3_kv.gguf");
  RewriteGguf(q3, q3_kv, {.metadata = [](const std::string& k, GgufValue& v) {
                            if (k == "qwen3.attention.value_length") v.u64 = v.i64 = 64;
                            return true;
                          }});
  ExpectLoadError(q3_kv, StatusCode::kUnsupported, "value_length");
}

TEST(ModelTest, UnsupportedArchitectureIsNamed) {
  const std::string src = WriteSmallModel("arch_src.gguf");
  const std::string dst = TempPath("arch.gguf");
  RewriteGguf(src, dst, {.metadata = [](const std::string& k, GgufValue& v) {
                           if (k == "general.architecture") v.str = "mamba";
                           return true;
                         }});
  ExpectLoadError(dst, StatusCode::kUnsupported, "architecture 'mamba'");
}

TEST(ModelTest, UnsupportedTensorTypeNamesTheTensor) {
  const std::string src = WriteSmallModel("type_src.gguf");
  const std::string dst = TempPath("type.gguf");
  RewriteGguf(src, dst, {.tensor = [](GgufTensorInfo& t) {
                           if (t.name == "blk.1.ffn_up.weight") t.type = GgmlType::kIQ2_XXS;
                           return true;
                         }});
  ExpectLoadError(dst, StatusCode::kUnsupported, "blk.1.ffn_up.weight");
  ExpectLoadError(dst, StatusCode::kUnsupported, "iq2_xxs");
}

TEST(ModelTest, MissingTensorIsNamed) {
  const std::string src = WriteSmallModel("miss_src.gguf");
  const std::string dst = TempPath("miss.gguf");
  RewriteGguf(src, dst, {.tensor = [](GgufTensorInfo& t) { return t.name != "blk.0.attn_v.weight"; }});
  ExpectLoadError(dst, StatusCode::kNotFound, "blk.0.attn_v.weight");
}

TEST(ModelTest, WrongShapeIsNamed) {
  const std::string src = WriteSmallModel("shape_src.gguf");
  const std::string dst = TempPath("shape.gguf");
  RewriteGguf(src, dst, {.metadata = [](const std::string& k, GgufValue& v) {
                           if (k == "llama.feed_forward_length") v.u64 = v.i64 = 768;
                           return true;
                         }});
  ExpectLoadError(dst, StatusCode::kInvalidArgument, "ffn_gate.weight");
}

TEST(ModelTest, BadHyperparametersAreNamed) {
  const std::string src = WriteSmallModel("hp_src.gguf");
  const std::string dst = TempPath("hp.gguf");
  RewriteGguf(src, dst, {.metadata = [](const std::string& k, GgufValue& v) {
                           if (k == "llama.attention.head_count_kv") v.u64 = v.i64 = 3;
                           return true;
                         }});
  ExpectLoadError(dst, StatusCode::kInvalidArgument, "head_count_kv");
  const std::string dst2 = TempPath("hp2.gguf");
  RewriteGguf(src, dst2, {.metadata = [](const std::string& k, GgufValue&) { return k != "llama.block_count"; }});
  ExpectLoadError(dst2, StatusCode::kNotFound, "llama.block_count");
}

TEST(ModelTest, TiedOutputUsesTokenEmbedding) {
  const std::string src = WriteSmallModel("tied_src.gguf");
  const std::string dst = TempPath("tied.gguf");
  RewriteGguf(src, dst, {.tensor = [](GgufTensorInfo& t) { return t.name != "output.weight"; }});
  auto m = Model::Load(dst);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE((*m)->tied_output());
  EXPECT_EQ(Greedy(**m, {1, 2, 3}, 3).size(), 3u);
}

// Llama 3 in GGUF: byte-level BPE vocab, rope theta 500000, GQA, and (3.1) a
// rope_freqs tensor of per-dimension frequency divisors. Mistral differs from Llama 2
// only in values (GQA 4:1, theta 1e6), covered by the same code paths.
TEST(ModelTest, Llama3StyleModelLoadsTokenizesAndRuns) {
  const std::string src = WriteSmallModel("l3_src.gguf", "q8_0", std::string(TRELLIS_TEST_DATA) + "/vocab/ggml-vocab-gpt-2.gguf");
  const std::string dst = TempPath("l3.gguf");
  const int half_dim = 256 / 4 / 2;
  RewriteGguf(src, dst, {.metadata =
                             [](const std::string& k, GgufValue& v) {
                               if (k == "llama.rope.freq_base") v.f64 = 500000.0;
                               return true;
                             },
                         .extra = [&](GgufWriter& w) {
                           std::vector<float> ff(static_cast<size_t>(half_dim));
                           for (int i = 0; i < half_dim; ++i) ff[static_cast<size_t>(i)] = i < half_dim / 2 ? 1.0f : 8.0f;
                           ASSERT_TRUE(w.AddTensorData("rope_freqs.weight", {half_dim}, GgmlType::kF32,
                                                       {reinterpret_cast<const uint8_t*>(ff.data()), ff.size() * 4})
                                           .ok());
                         }});
  auto m = Model::Load(dst);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FLOAT_EQ((*m)->config().rope_freq_base, 500000.0f);
  ASSERT_EQ((*m)->rope_freqs().size(), static_cast<size_t>(half_dim));
  auto tok = Tokenizer::FromGguf((*m)->gguf());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->kind(), TokenizerKind::kBpe);
  const std::vector<int32_t> ids = (*tok)->Encode("Hello world", false, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ((*tok)->Decode(ids), "Hello world");
  const auto with_ff = Greedy(**m, ids, 4);
  EXPECT_EQ(with_ff.size(), 4u);

  // The frequency factors change the computation (they are not silently ignored).
  const std::string plain = TempPath("l3_plain.gguf");
  RewriteGguf(dst, plain, {.tensor = [](GgufTensorInfo& t) { return t.name != "rope_freqs.weight"; }});
  auto m2 = Model::Load(plain);
  ASSERT_TRUE(m2.ok());
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> a = PromptLogits(**m, prompt), b = PromptLogits(**m2, prompt);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::abs(a[i] - b[i]);
  EXPECT_GT(diff, 1e-3);
}

}  // namespace
}  // namespace trellis
