#include <cstdio>
#include <filesystem>

#include "cli/commands.h"

#ifndef TRELLIS_SOURCE_DIR
#define TRELLIS_SOURCE_DIR "."
#endif

namespace trellis::cli {

int Fail(const std::string& message) {
  std::fprintf(stderr, "trellis: %s\n", message.c_str());
  return 1;
}

std::string DefaultVocabPath() {
  // Installed next to the binary's source tree; overridable with --vocab.
  return std::string(TRELLIS_SOURCE_DIR) + "/tests/data/vocab/ggml-vocab-llama-spm.gguf";
}

}  // namespace trellis::cli
