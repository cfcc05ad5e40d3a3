// llama_decode_dump: writes the decode oracle of tests/data/reference (MODEL.pN.decode_logits.f32)
// with llama.cpp, the independent implementation Trellis is checked against.
//
// Not part of the Trellis build: it links llama.cpp's libllama, built outside this
// repository at the commit the reference data names (3f545beccee6):
//
//   cmake -S llama.cpp -B llama-build -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF && ninja -C llama-build llama
//   g++ -O2 -std=c++17 tools/llama_decode_dump.cc -Illama.cpp/include -Illama.cpp/ggml/include \
//       -Lllama-build/bin -lllama -lggml -lggml-base -Wl,-rpath,$PWD/llama-build/bin -o /tmp/decode_dump
//   /tmp/decode_dump tests/data/reference/ref-a-f16.gguf tests/data/reference/ref-a-f16.p67
//
// For STEM.json (prompt ids and llama.cpp's 32 greedy tokens) it decodes the prompt in one
// batch (1 thread, n_ctx 512, n_batch 512), checks that those logits equal
// STEM.all_logits.f32 (the same program state that made them), then feeds greedy[k] at
// position n_prompt + k, one single-token decode each, and writes each step's logits to
// STEM.decode_logits.f32 ([32][n_vocab] little-endian float32). It reports where the
// argmax of a step differs from the recorded greedy token (never expected).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: llama_decode_dump MODEL.gguf STEM  (reads STEM.json, STEM.all_logits.f32)\n");
    return 2;
  }
  const std::string stem = argv[2];
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(stem + ".json"));
  const std::vector<llama_token> prompt = j["prompt"].get<std::vector<llama_token>>();
  const std::vector<llama_token> greedy = j["greedy"].get<std::vector<llama_token>>();
  std::vector<float> ref_prompt;
  {
    std::ifstream f(stem + ".all_logits.f32", std::ios::binary);
    std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ref_prompt.resize(b.size() / 4);
    std::memcpy(ref_prompt.data(), b.data(), ref_prompt.size() * 4);
  }

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_threads = 1;
  cp.n_threads_batch = 1;
  llama_context* ctx = llama_init_from_model(model, cp);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const int n = static_cast<int>(prompt.size());

  llama_batch b = llama_batch_init(512, 0, 1);
  b.n_tokens = n;
  for (int i = 0; i < n; ++i) {
    b.token[i] = prompt[i];
    b.pos[i] = i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  if (llama_decode(ctx, b) != 0) return 1;
  double max_diff = 0;
  if (ref_prompt.size() == static_cast<size_t>(n) * n_vocab) {
    for (int i = 0; i < n; ++i) {
      const float* l = llama_get_logits_ith(ctx, i);
      for (int v = 0; v < n_vocab; ++v) max_diff = std::max(max_diff, std::fabs(double(l[v]) - ref_prompt[size_t(i) * n_vocab + v]));
    }
  } else {
    max_diff = INFINITY;
  }

  auto argmax = [&](const float* l) {
    int a = 0;
    for (int v = 1; v < n_vocab; ++v) if (l[v] > l[a]) a = v;
    return a;
  };
  std::vector<float> out;
  int mismatches = 0;
  for (size_t k = 0; k < greedy.size(); ++k) {
    b.n_tokens = 1;
    b.token[0] = greedy[k];
    b.pos[0] = n + static_cast<int>(k);
    b.n_seq_id[0] = 1;
    b.seq_id[0][0] = 0;
    b.logits[0] = 1;
    if (llama_decode(ctx, b) != 0) return 1;
    const float* l = llama_get_logits_ith(ctx, 0);
    out.insert(out.end(), l, l + n_vocab);
    if (k + 1 < greedy.size() && argmax(l) != greedy[k + 1]) ++mismatches;
  }
  std::FILE* f = std::fopen((stem + ".decode_logits.f32").c_str(), "wb");
  if (!f || std::fwrite(out.data(), sizeof(float), out.size(), f) != out.size()) return 1;
  std::fclose(f);
  std::printf("%s: prompt rows vs all_logits.f32: max |diff| %.3g; %zu decode rows; argmax != greedy at %d steps\n",
              stem.c_str(), max_diff, greedy.size(), mismatches);
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
