// trellis/engine.h: run a GGUF model in your own program.
//
//   auto engine = trellis::Engine::Open({.model_path = "model.gguf"});
//   if (!engine.ok()) { /* engine.status().ToString() says why */ }
//   trellis::GenerateOptions g;
//   g.max_tokens = 64;
//   auto out = (*engine)->Generate("The capital of France is", g,
//                                  [](std::string_view piece) { std::fputs(std::string(piece).c_str(), stdout); return true; });
//
// One Engine serves many callers at once: Generate is thread-safe, and concurrent calls
// are decoded together in batches on the engine's own thread. Prompts that share a
// prefix with anything computed before reuse its KV blocks (the prefix cache), and with
// `store` set, with anything any engine on the prefix store computed; each Completion's
// receipt says where its prompt's tokens came from.
//
// This header and trellis/status.h are the whole interface: nothing here includes the
// runtime's internal headers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/status.h"

namespace trellis {

struct EngineConfig {
  std::string model_path;        // a GGUF file
  int threads = 0;               // 0: the physical cores this process may use
  int ctx_size = 0;              // positions per session; 0: the model's, at most 4096
  int64_t kv_memory_bytes = 0;   // the shared KV pool; 0: four full contexts
  int block_size = 32;           // tokens per KV block
  int max_running = 8;           // sessions decoded together
  bool prefix_cache = true;      // reuse KV of prefixes computed before
  // This node's prefix store server ("host:port"), or "": prefixes computed by any
  // engine on the store are reused here, and this engine's are published. A store that
  // is down never keeps the engine from running: its prompts are computed.
  std::string store;
};

struct GenerateOptions {
  int max_tokens = 128;          // at most this many generated tokens
  float temperature = 0.0f;      // 0: greedy
  float top_p = 1.0f;
  int top_k = 0;                 // 0: off
  float min_p = 0.0f;
  float repeat_penalty = 1.0f;   // 1: off
  uint64_t seed = 0;             // sampling seed (temperature > 0)
  bool stop_at_end = true;       // stop at the model's end-of-generation tokens
  bool add_bos = true;           // text prompts: start with the model's BOS token, if it has one
  uint64_t cache_salt = 0;       // prompts with different salts share no cached blocks
};

// Where a prompt's tokens came from.
struct PromptReceipt {
  int prompt_tokens = 0;
  int cached = 0;    // this engine's prefix cache
  int store = 0;     // the prefix store (other engines' work)
  int computed = 0;  // run through the model for this request
};

struct Completion {
  std::vector<int32_t> tokens;  // generated token ids
  std::string text;             // their text
  std::string finish_reason;    // "stop" (an end token), "length" (max_tokens or the context)
  PromptReceipt receipt;
  double ttft_seconds = 0;      // submit to the first token
  double total_seconds = 0;
};

struct ModelInfo {
  std::string architecture;  // "llama", "qwen2", ...
  int n_vocab = 0, n_layer = 0, n_embd = 0;
  int ctx_size = 0;          // the context each session has here
  std::string kernels;       // the CPU kernel path in use ("avx512 (VNNI, BF16)", ...)
};

// Called with each generated token's text (possibly empty while a multi-byte character
// is incomplete) and id; return false to stop the generation there. An end token's text
// is empty. A last call with token -1 may carry the text of an incomplete character left
// at the end (as U+FFFD).
using TokenSink = std::function<bool(std::string_view piece, int32_t token)>;

class Engine {
 public:
  // Loads the model, sizes the KV pool and starts the engine thread. Errors: a file that
  // is not a usable GGUF (NotFound, Corrupt, Unsupported), options out of range
  // (InvalidArgument), a pool that does not fit (ResourceExhausted).
  static Result<std::unique_ptr<Engine>> Open(const EngineConfig& config);
  ~Engine();  // cancels what is running, then stops
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs one generation to its end, streaming through `sink` if given. Thread-safe.
  // Errors: an empty prompt or one that does not fit the context (InvalidArgument), a
  // queue that is full (ResourceExhausted), a failure of the engine.
  Result<Completion> Generate(std::span<const int32_t> prompt, const GenerateOptions& options, const TokenSink& sink = {});
  // The same for text, tokenized with the model's tokenizer (special tokens such as
  // "<|im_start|>" in the text are parsed as such: the text is the caller's own).
  Result<Completion> Generate(std::string_view prompt, const GenerateOptions& options, const TokenSink& sink = {});

  std::vector<int32_t> Tokenize(std::string_view text, bool add_bos = true) const;
  std::string Detokenize(std::span<const int32_t> tokens) const;
  ModelInfo info() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis
