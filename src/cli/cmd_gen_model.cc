#include <cstdio>

#include "cli/commands.h"
#include "engine/random_model.h"
#include "util/clock.h"

namespace trellis::cli {

Runner AddGenModelCommand(CLI::App& app) {
  struct Opts {
    std::string shape = "tiny", type = "q4_0", arch = "llama", vocab, out;
    int head_dim = 0, rope_dims = 0, layers = 0, yarn_orig_ctx = 0, ctx = 0;
    float yarn = 0;
    bool pure = false;
    uint64_t seed = 1;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--shape", o->shape, "tinyllama (TinyLlama-1.1B dimensions), tiny (a few MB), ptstore (bench store's model), ref-a (tests/data/reference), small (the unit tests'); mixtures: moe-tiny, qwen3-30b-a3b, mixtral-small")->capture_default_str();
  app.add_option("--arch", o->arch, "llama, llama3.2 (tied output, llama3 rope_freqs), qwen2 (QKV bias), qwen3 (Q/K norm), phi3 (fused QKV and gate/up, LongRoPE), gemma2, gemma3 (sliding window, soft-caps, GeGLU), qwen3moe, mixtral (mixtures of experts: with a mixture shape)")->capture_default_str();
  app.add_option("--head-dim", o->head_dim, "head dim other than n_embd / n_head (written as attention.key_length)");
  app.add_option("--layers", o->layers, "another layer count than the shape's (a benchmark model with a large model's layers, fewer of them)");
  app.add_option("--rope-dims", o->rope_dims, "rotated dims per head, fewer than the head dim for partial rotary");
  app.add_option("--ctx", o->ctx, "another trained context than the shape's (llama.context_length)");
  app.add_option("--yarn", o->yarn, "YaRN rope scaling by this factor (rope.scaling.type yarn), with --yarn-orig-ctx");
  app.add_option("--yarn-orig-ctx", o->yarn_orig_ctx, "YaRN's original context (rope.scaling.original_context_length)");
  app.add_option("--type", o->type, "f32, f16, bf16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k")->capture_default_str();
  app.add_option("--vocab", o->vocab, "GGUF whose tokenizer.* metadata is copied (default: the shipped LLaMA SPM vocab)");
  app.add_option("-o,--output", o->out, "output GGUF path")->required();
  app.add_flag("--pure", o->pure, "quantize output.weight like the rest (llama-quantize keeps it q6_K)");
  app.add_option("--seed", o->seed, "weight seed")->capture_default_str();
  app.add_option("-t,--threads", o->threads, kThreadsHelp);
  return [o] {
    auto shape = ModelShapeByName(o->shape);
    if (!shape.ok()) return Fail(shape.status().message());
    const std::string vocab_path = o->vocab.empty() ? DefaultVocabPath() : o->vocab;
    auto vocab = GgufFile::Open(vocab_path);
    if (!vocab.ok()) return Fail(vocab.status().ToString());
    RandomModelOptions ro;
    ro.shape = *shape;
    if (o->head_dim > 0) ro.shape.head_dim = o->head_dim;
    if (o->rope_dims > 0) ro.shape.n_rot = o->rope_dims;
    if (o->layers > 0) ro.shape.n_layer = o->layers;
    if (o->ctx > 0) ro.shape.n_ctx = o->ctx;
    ro.arch = o->arch;
    ro.type = o->type;
    ro.pure = o->pure;
    ro.seed = o->seed;
    ro.yarn_factor = o->yarn;
    ro.yarn_orig_ctx = o->yarn_orig_ctx;
    ro.n_threads = ResolveThreads(o->threads);
    const double t0 = NowSeconds();
    Status s = WriteRandomModel(ro, *vocab, o->out);
    if (!s.ok()) return Fail(s.ToString());
    std::fprintf(stderr, "gen-model: wrote %s (%s, %s, %s) in %.1f s\n", o->out.c_str(), o->arch.c_str(), o->shape.c_str(), o->type.c_str(),
                 NowSeconds() - t0);
    return 0;
  };
}

}  // namespace trellis::cli
