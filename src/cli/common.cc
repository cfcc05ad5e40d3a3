#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "util/cpus.h"

#ifndef TRELLIS_SOURCE_DIR
#define TRELLIS_SOURCE_DIR "."
#endif

namespace trellis::cli {

sigset_t BlockStopSignals() {
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  return sigs;
}

int ResolveThreads(int requested, std::string* how) {
  if (how) how->clear();
  if (requested > 0) return requested;
  const CpuBudget b = ProbeCpus();
  if (how) *how = "default: " + b.Describe();
  return b.threads;
}

std::string ThreadsText(int threads, const std::string& how) {
  return std::to_string(threads) + (threads == 1 ? " thread" : " threads") + (how.empty() ? "" : " (" + how + ")");
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "trellis: %s\n", message.c_str());
  return 1;
}

Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& s, const std::string& flag) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0) return InvalidArgument(flag + " takes HOST:PORT, got '" + s + "'");
  const std::string port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return InvalidArgument(flag + ": '" + port + "' is not a port");
  }
  return std::make_pair(s.substr(0, colon), static_cast<uint16_t>(std::stoi(port)));
}

std::string DefaultVocabPath() {
  // Installed next to the binary's source tree; overridable with --vocab.
  return std::string(TRELLIS_SOURCE_DIR) + "/tests/data/vocab/ggml-vocab-llama-spm.gguf";
}

}  // namespace trellis::cli
