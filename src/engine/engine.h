// Engine: runs generation for a model over a paged KV pool.
//
// Owns the thread pool, the KV block pool and the forward pass. A session's KV is a
// block table filled from the pool as its context grows and released when it ends.
// Prompts are prefilled in chunks of at most max_batch_tokens through the batched
// forward pass; decode then runs one token per step.
//
// Thread safety: not thread-safe. One thread (the engine thread) calls Generate.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/forward.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "kv/block_pool.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace trellis {

struct EngineOptions {
  int n_threads = 2;
  int block_size = 32;          // tokens per KV block
  int n_ctx = 0;                // max positions per session; 0 = min(trained context, 4096)
  int64_t kv_blocks = 0;        // pool size in blocks; 0 = from kv_memory_bytes or n_ctx
  int64_t kv_memory_bytes = 0;  // pool size in bytes; 0 = enough for one full context
  int max_batch_tokens = 512;   // prefill chunk
  bool all_logits = false;      // keep logits for every prompt position (--dump-logits)
  int max_logit_rows = 0;       // logit rows per forward pass; 0 = 1 (or max_batch_tokens with all_logits)
};

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int n_predict = 64;
  SamplerParams sampling;
  // Stops generation when it returns true for a sampled token (end of generation).
  std::function<bool(int32_t)> is_eog;
  // Teacher forcing (checking decode against a reference): step i feeds force_tokens[i]
  // instead of a sampled token, for every i < size(); n_predict is ignored, is_eog too.
  // With EngineOptions::all_logits, decode_logits gets the logits after each is fed.
  std::vector<int32_t> force_tokens;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (including an end-of-generation token)
  int n_prompt = 0;
  double prompt_seconds = 0;    // prefill wall time
  double ttft_seconds = 0;      // request start to first sampled token
  double gen_seconds = 0;       // decode wall time after the first token
  bool context_full = false;    // stopped because n_ctx was reached
  std::vector<float> prompt_logits;  // [n_prompt][n_vocab] when EngineOptions::all_logits
  // [steps][n_vocab] when EngineOptions::all_logits: row i is the logits after feeding
  // tokens[i] through single-token decode (the distribution tokens[i + 1] is drawn from).
  std::vector<float> decode_logits;
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const Model& model, const EngineOptions& opts);

  // Runs one session to completion. on_token is called for each sampled token; return
  // false from it to stop early.
  Result<GenerateResult> Generate(const GenerateRequest& req,
                                  const std::function<bool(int32_t)>& on_token = nullptr);

  const Model& model() const { return model_; }
  const EngineOptions& options() const { return opts_; }
  BlockPool& pool() { return *pool_; }
  ThreadPool& threads() { return threads_; }
  Forward& forward() { return *forward_; }

 private:
  Engine(const Model& model, const EngineOptions& opts);

  const Model& model_;
  EngineOptions opts_;
  ThreadPool threads_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<Forward> forward_;
};

// KV geometry of a model for a given block size.
KvLayout KvLayoutFor(const ModelConfig& c, int block_size);
// The layout of the pool a process holding model part m keeps: its layers only (none at
// a grid head that runs no layers: the pool then only hands out block ids).
KvLayout LocalKvLayoutFor(const Model& m, int block_size);

}  // namespace trellis
