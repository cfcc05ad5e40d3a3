// llama_tokenize_dump: writes tokenizer test vectors (tests/data/vocab/*.out) with
// llama.cpp's tokenizer, the independent implementation Trellis is checked against.
//
// Not part of the Trellis build: it links llama.cpp's libllama, built outside this
// repository at the commit the test data names (3f545beccee6); see
// tools/llama_reference_dump.cc for the build line.
//
//   tokenize_dump VOCAB.gguf INPUTS.inp OUT.out
//
// INPUTS.inp holds the test strings separated by "\n__ggml_vocab_test__\n" (the file ends
// with one); OUT.out gets one line of space-separated token ids per input, tokenized as
// llama.cpp's test-tokenizer-0 does (no BOS/EOS added, special tokens not parsed): the
// format of llama.cpp's own models/ggml-vocab-*.gguf.out files.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tokenize_dump VOCAB.gguf INPUTS.inp OUT.out\n");
    return 2;
  }
  std::stringstream ss;
  ss << std::ifstream(argv[2], std::ios::binary).rdbuf();
  const std::string inp = ss.str(), sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(inp.substr(pos));
      break;
    }
    inputs.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::FILE* out = std::fopen(argv[3], "w");
  if (!out) return 1;
  for (const std::string& text : inputs) {
    std::vector<llama_token> ids(text.size() + 16);
    int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                           static_cast<int32_t>(ids.size()), /*add_special=*/false, /*parse_special=*/false);
    if (n < 0) {
      ids.resize(static_cast<size_t>(-n));
      n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                         static_cast<int32_t>(ids.size()), false, false);
    }
    for (int i = 0; i < n; ++i) std::fprintf(out, " %d", ids[static_cast<size_t>(i)]);  // as llama.cpp's files
    std::fprintf(out, "\n");
  }
  std::fclose(out);
  std::fprintf(stderr, "%s: %zu inputs tokenized\n", argv[3], inputs.size());
  llama_model_free(model);
  return 0;
}
