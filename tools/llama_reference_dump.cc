// llama_reference_dump: writes the reference data of tests/data/reference with llama.cpp,
// the independent implementation Trellis is checked against.
//
// Not part of the Trellis build: it links llama.cpp's libllama, built outside this
// repository at the commit the reference data names (3f545beccee6):
//
//   cmake -S llama.cpp -B llama-build -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF && ninja -C llama-build llama
//   g++ -O2 -std=c++17 tools/llama_reference_dump.cc -Illama.cpp/include -Illama.cpp/ggml/include \
//       -Lllama-build/bin -lllama -lggml -lggml-base -Wl,-rpath,$PWD/llama-build/bin -o /tmp/reference_dump
//
// Two modes, both 1 thread, n_ctx 512, n_batch 512, the whole prompt in one batch:
//
//   reference_dump MODEL.gguf STEM
//     For an existing STEM.json (prompt ids and llama.cpp's 32 greedy tokens): checks that
//     the prompt logits equal STEM.all_logits.f32, then feeds greedy[k] at position
//     n_prompt + k, one single-token decode each, and writes STEM.decode_logits.f32
//     ([32][n_vocab] little-endian float32). Reports where a step's argmax differs from
//     the recorded greedy token (never expected).
//
//   reference_dump --make MODEL.gguf STEM PROMPT.json
//     Makes the whole set for a new model from the prompt ids of PROMPT.json (its
//     "prompt" array, BOS first): STEM.all_logits.f32 (every prompt position), the greedy
//     continuation (greedy[0] = argmax at the last prompt position, then 31 single-token
//     decodes of its own argmax), STEM.decode_logits.f32 (the logits after each greedy
//     token: the same teacher-forced rows the first mode writes) and STEM.json
//     (prompt, argmax_per_position, min_top2_margin_prompt, greedy, greedy_top2_margins).
//
//   reference_dump --kv TYPE_K TYPE_V ...
//     Any mode above with llama.cpp's K/V cache in these types (f16, q8_0, q4_0; as
//     -ctk/-ctv, flash attention on, which a quantized V needs): the references of
//     Trellis's quantized K/V (STEM.json then also says "type_k", "type_v").
//
//   reference_dump --make MODEL.gguf STEM PROMPT.json STEPS PROMPT_ROWS
//     The same with STEPS greedy tokens and decode rows, and only the last PROMPT_ROWS
//     prompt rows in all_logits.f32 (STEM.json says both: "steps", "prompt_rows"): for
//     vocabularies so large that 32 + N full rows would not belong in a repository.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llama.h"

namespace {

constexpr int kSteps = 32;

// --kv: the cache types (empty: llama.cpp's defaults, f16).
std::string g_type_k, g_type_v;

bool KvType(const std::string& name, ggml_type* t) {
  if (name == "f16") *t = GGML_TYPE_F16;
  else if (name == "q8_0") *t = GGML_TYPE_Q8_0;
  else if (name == "q4_0") *t = GGML_TYPE_Q4_0;
  else return false;
  return true;
}

std::vector<float> ReadF32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> out(b.size() / 4);
  std::memcpy(out.data(), b.data(), out.size() * 4);
  return out;
}

bool WriteF32(const std::string& path, const std::vector<float>& v) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(v.data(), sizeof(float), v.size(), f) == v.size();
  return std::fclose(f) == 0 && ok;
}

int Argmax(const float* l, int n) { return static_cast<int>(std::max_element(l, l + n) - l); }

double Top2Margin(const float* l, int n) {
  std::vector<float> s(l, l + n);
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  return double(s[0]) - s[1];
}

double Round5(double x) { return std::round(x * 1e5) / 1e5; }

struct Llama {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  llama_batch batch{};
  int n_vocab = 0;

  bool Open(const char* path) {
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    model = llama_model_load_from_file(path, mp);
    if (!model) return false;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    if (!g_type_k.empty()) {
      if (!KvType(g_type_k, &cp.type_k) || !KvType(g_type_v, &cp.type_v)) return false;
      cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    }
    ctx = llama_init_from_model(model, cp);
    if (!ctx) return false;
    n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    batch = llama_batch_init(512, 0, 1);
    return true;
  }
  // Decodes tokens at positions pos0.., logits for every one of them.
  bool Decode(const std::vector<llama_token>& tokens, int pos0) {
    batch.n_tokens = static_cast<int>(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      batch.token[i] = tokens[i];
      batch.pos[i] = pos0 + static_cast<int>(i);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    return llama_decode(ctx, batch) == 0;
  }
  const float* Logits(int i) { return llama_get_logits_ith(ctx, i); }
  ~Llama() {
    if (batch.token) llama_batch_free(batch);
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
  }
};

int Make(const char* model_path, const std::string& stem, const std::string& prompt_json, int steps = kSteps,
         int prompt_rows = -1) {
  const nlohmann::json pj = nlohmann::json::parse(std::ifstream(prompt_json));
  const std::vector<llama_token> prompt = pj["prompt"].get<std::vector<llama_token>>();
  Llama L;
  if (!L.Open(model_path)) return 1;
  const int n = static_cast<int>(prompt.size()), V = L.n_vocab;
  if (!L.Decode(prompt, 0)) return 1;
  std::vector<float> all;
  std::vector<int> argmax;
  double min_margin = INFINITY;
  if (prompt_rows < 0 || prompt_rows > n) prompt_rows = n;
  for (int i = 0; i < n; ++i) {
    const float* l = L.Logits(i);
    if (i >= n - prompt_rows) all.insert(all.end(), l, l + V);
    argmax.push_back(Argmax(l, V));
    min_margin = std::min(min_margin, Top2Margin(l, V));
  }
  std::vector<llama_token> greedy = {argmax.back()};
  std::vector<double> margins;
  std::vector<float> decode;
  for (int k = 0; k < steps; ++k) {
    if (!L.Decode({greedy[k]}, n + k)) return 1;
    const float* l = L.Logits(0);
    decode.insert(decode.end(), l, l + V);
    margins.push_back(Round5(Top2Margin(l, V)));
    if (k + 1 < steps) greedy.push_back(Argmax(l, V));
  }
  nlohmann::json out;
  out["n_vocab"] = V;
  out["prompt"] = prompt;
  out["argmax_per_position"] = argmax;
  out["min_top2_margin_prompt"] = Round5(min_margin);
  out["greedy"] = greedy;
  out["greedy_top2_margins"] = margins;
  if (!g_type_k.empty()) {
    out["type_k"] = g_type_k;
    out["type_v"] = g_type_v;
  }
  if (steps != kSteps || prompt_rows != n) {
    out["steps"] = steps;
    out["prompt_rows"] = prompt_rows;
  }
  std::ofstream(stem + ".json") << out.dump() << "\n";
  if (!WriteF32(stem + ".all_logits.f32", all) || !WriteF32(stem + ".decode_logits.f32", decode)) return 1;
  std::printf("%s: %d prompt rows (%d written), %d decode rows, min prompt margin %.3f, min greedy margin %.3f\n",
              stem.c_str(), n, prompt_rows, steps, min_margin, *std::min_element(margins.begin(), margins.end()));
  return 0;
}

int DecodeOnly(const char* model_path, const std::string& stem) {
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(stem + ".json"));
  const std::vector<llama_token> prompt = j["prompt"].get<std::vector<llama_token>>();
  const std::vector<llama_token> greedy = j["greedy"].get<std::vector<llama_token>>();
  const std::vector<float> ref_prompt = ReadF32(stem + ".all_logits.f32");
  Llama L;
  if (!L.Open(model_path)) return 1;
  const int n = static_cast<int>(prompt.size()), V = L.n_vocab;
  if (!L.Decode(prompt, 0)) return 1;
  double max_diff = 0;
  if (ref_prompt.size() == static_cast<size_t>(n) * V) {
    for (int i = 0; i < n; ++i) {
      const float* l = L.Logits(i);
      for (int v = 0; v < V; ++v) max_diff = std::max(max_diff, std::fabs(double(l[v]) - ref_prompt[size_t(i) * V + v]));
    }
  } else {
    max_diff = INFINITY;
  }
  std::vector<float> out;
  int mismatches = 0;
  for (size_t k = 0; k < greedy.size(); ++k) {
    if (!L.Decode({greedy[k]}, n + static_cast<int>(k))) return 1;
    const float* l = L.Logits(0);
    out.insert(out.end(), l, l + V);
    if (k + 1 < greedy.size() && Argmax(l, V) != greedy[k + 1]) ++mismatches;
  }
  if (!WriteF32(stem + ".decode_logits.f32", out)) return 1;
  std::printf("%s: prompt rows vs all_logits.f32: max |diff| %.3g; %zu decode rows; argmax != greedy at %d steps\n",
              stem.c_str(), max_diff, greedy.size(), mismatches);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--kv") {
    g_type_k = argv[2];
    g_type_v = argv[3];
    argv[3] = argv[0];
    argv += 3;
    argc -= 3;
  }
  if (argc == 5 && std::string(argv[1]) == "--make") return Make(argv[2], argv[3], argv[4]);
  if (argc == 7 && std::string(argv[1]) == "--make") {
    return Make(argv[2], argv[3], argv[4], std::atoi(argv[5]), std::atoi(argv[6]));
  }
  if (argc == 3) return DecodeOnly(argv[1], argv[2]);
  std::fprintf(stderr,
               "usage: reference_dump MODEL.gguf STEM                        (reads STEM.json, STEM.all_logits.f32)\n"
               "       reference_dump --make MODEL.gguf STEM PROMPT.json     (writes STEM.json and both .f32 files)\n"
               "       reference_dump --make MODEL.gguf STEM PROMPT.json STEPS PROMPT_ROWS\n"
               "       reference_dump --kv TYPE_K TYPE_V (any of the above)\n");
  return 2;
}
