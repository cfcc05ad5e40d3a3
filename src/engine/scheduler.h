// Scheduler: continuous batching of many sessions over one shared KV pool with a
// RadixAttention prefix cache.
//
// A session is a token sequence (prompt, then everything it generates) and the number
// of leading positions whose K/V is in its blocks. Each Step() builds one batch:
//   1. every session with exactly one pending token (decode) gets its token, so running
//      sessions never stall behind a long prompt;
//   2. sessions with more pending tokens (prefill) get chunks of at most prefill_chunk
//      tokens from what is left of max_batch_tokens, in admission order;
// runs it through the weights once, then samples for every session whose run reached
// the end of its sequence. Decode is prefill with one pending token; preemption is
// dropping a session's blocks and setting its computed count back to zero.
//
// Prefix cache: on admission a session matches its sequence against the radix tree,
// acquires the cached whole blocks (refcount + 1) instead of allocating and computing
// them, and locks the matched path. As its blocks fill (prefill or decode) they are
// inserted, so a later session sharing the prefix finds them; the session's last,
// partly filled block stays private until full. Memory: "plan, then apply". Admission
// waits when blocks are short, evicts cold unlocked leaves, and a decode that needs a
// block preempts the most recently admitted other session (recomputed later, often
// from the cache) before anything fails.
//
// Thread safety: not thread-safe. One engine thread owns the scheduler, its pool, tree
// and sessions, and calls Submit/Cancel/Step; callbacks run on that thread. EngineLoop
// (engine_loop.h) puts it behind a queue for other threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/forward.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/step_executor.h"
#include "grammar/token_mask.h"
#include "kv/block_pool.h"
#include "kv/prefix_store.h"
#include "kv/radix_cache.h"
#include "util/env.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace trellis {

using RequestId = int64_t;

struct SchedulerOptions {
  int block_size = 32;          // tokens per KV block
  // Element types of K and of V in the pool (docs/kv_layout.md): f16, or q8_0 / q4_0 to
  // hold about 1.9x / 3.6x the tokens in the same memory (llama.cpp's -ctk / -ctv).
  KvType kv_type_k = KvType::kF16;
  KvType kv_type_v = KvType::kF16;
  int64_t kv_blocks = 0;        // pool size in blocks (0: from kv_memory_bytes, else 4 contexts)
  int64_t kv_memory_bytes = 0;
  int n_ctx = 0;                // max positions per session (0: min(trained context, 4096))
  int max_batch_tokens = 512;   // tokens per step, decode and prefill together
  int prefill_chunk = 512;      // max prefill tokens of one session per step
  int max_running = 64;         // sessions admitted at once
  bool prefix_cache = true;
  // Requests may ask for the logits of every prompt position (Request::prompt_logits):
  // the executor keeps max_batch_tokens more logit rows. Local executor only.
  bool prompt_logits = false;
  std::string eviction = "lru";  // "lru" or "lfu"
  // A shared prefix store (borrowed; outlives the scheduler), or null. On admission,
  // after the local match, the rest of the prompt's whole blocks are looked up there and
  // read into the session's new blocks when that is estimated quicker than computing
  // them; the blocks a session computes are published to it after its prefill and when
  // it finishes. The engine thread never waits on it.
  PrefixStore* store = nullptr;
  // Makes the executor that runs batches (a grid head's, say); null: the whole model in
  // this process (LocalExecutor). An executor with depth() > 1 gets up to that many
  // micro-batches in flight: the running sessions are split between them, and a prompt's
  // prefill chunks follow each other through the pipeline.
  ExecutorFactory executor = nullptr;
  // The clock request times (TTFT, totals, the store's cost estimates) are read from;
  // null: Env::Default()'s. A test's Env moves it by hand.
  Env* env = nullptr;
};

enum class FinishReason { kStop, kLength, kContextFull, kCancelled, kError };
const char* FinishReasonName(FinishReason r);

struct Request {
  std::vector<int32_t> prompt;
  int max_tokens = 64;
  // Refuse a request whose prompt + max_tokens exceeds the context (as OpenAI does for an
  // explicit max_tokens) rather than stopping it with kContextFull when the context fills.
  bool max_tokens_must_fit = false;
  SamplerParams sampling;
  uint64_t cache_salt = 0;                 // tenants with different salts share no blocks
  std::function<bool(int32_t)> is_stop;    // end of generation (e.g. tokenizer EOG)
  bool logits = false;                     // pass each sampled step's logits to on_token
  // The logits of every prompt position into RequestResult::prompt_logits (checking a
  // model against a reference, --dump-logits). Such a prompt is computed whole: nothing
  // is taken from the prefix cache or the store (reused positions have no logits).
  // REQUIRES: SchedulerOptions::prompt_logits.
  bool prompt_logits = false;
  // Teacher forcing (checking decode against a reference): generated token i is
  // force_tokens[i] instead of a sampled one while i < size(); on_token still gets the
  // logits it would have been drawn from.
  std::vector<int32_t> force_tokens;
  // Constrained decoding (null: none): every sampled token is drawn from the tokens the
  // grammar allows next (the mask applies before logit_bias, penalties and the draw,
  // greedy included), and an end token only once the grammar is complete, which it is
  // then forced to be when nothing else may follow. A token the grammar cannot take (all
  // allowed ones banned by logit_bias, say) ends the request with an error.
  // REQUIRES: the grammar's vocabulary is the model's; no force_tokens.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// Where a request's prompt K/V came from (tokens).
struct CacheReceipt {
  int local = 0;     // this node's radix cache
  int store = 0;     // read from the prefix store, of which:
  int store_memory = 0, store_replica = 0, store_ssd = 0, store_remote = 0;
  int waited_for = 0;  // of `store`: computed elsewhere while this request waited for it
  int computed = 0;    // computed for this request
  // Prompt tokens the store could not give, by reason (StoreMiss; [0] unused).
  int misses[kStoreMissKinds] = {};
};

struct RequestResult {
  FinishReason reason = FinishReason::kStop;
  Status error;                  // set when reason == kError
  std::vector<int32_t> tokens;   // generated
  int n_prompt = 0;
  int n_cached = 0;              // prompt tokens taken from the prefix cache or store (last admission)
  CacheReceipt cache;            // the same, by source (last admission)
  int n_preempted = 0;
  double ttft_seconds = 0;       // submit to first token
  double total_seconds = 0;
  std::vector<float> prompt_logits;  // [n_prompt][n_vocab] with Request::prompt_logits
};

// Called for every sampled token; `logits` is non-empty only if Request::logits.
using TokenCallback = std::function<void(RequestId, int32_t token, std::span<const float> logits)>;
using FinishCallback = std::function<void(RequestId, const RequestResult&)>;

struct SchedulerMetrics {
  int64_t requests = 0, finished = 0, cancelled = 0;
  int64_t prompt_tokens = 0;      // prompt tokens of admitted requests
  int64_t cached_tokens = 0;      // of which taken from the cache
  int64_t computed_tokens = 0;    // tokens run through the model (prefill + decode)
  int64_t generated_tokens = 0;
  int64_t blocks_allocated = 0;   // fresh blocks from the pool
  int64_t blocks_acquired = 0;    // cached blocks shared (refcount + 1)
  int64_t partial_copies = 0;     // cached block prefixes copied into a new block (reuse to the token)
  int64_t partial_tokens = 0;     // prompt tokens those copies brought (part of cached_tokens)
  int64_t evicted_blocks = 0;
  // The prefix store (zero without one).
  int64_t store_fetches = 0;        // fetches completed
  int64_t store_tokens = 0;         // prompt tokens read from the store
  int64_t store_waited_tokens = 0;  // of which another node was computing when asked (single-flight)
  int64_t store_tier_tokens[4] = {};  // of which from: local memory, local replica, local SSD, other nodes
  int64_t store_miss_tokens[kStoreMissKinds] = {};  // tokens it could not give, by StoreMiss
  int64_t store_published_blocks = 0;
  int64_t store_publish_failures = 0;
  int32_t store_publishes_in_flight = 0;  // publishes started and not completed (a gauge)
  double store_fetch_seconds = 0;   // summed over fetches
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t grammar_masks = 0;        // token masks applied (one per constrained sampled token)
  double grammar_mask_seconds = 0;  // computing and applying them, on the scheduler thread
  int32_t running = 0, waiting = 0;
  int32_t pool_used = 0, pool_total = 0;
  // What the pool is: tokens per block, the K/V types, and the bytes one token's K/V
  // takes over all of the model's layers (on a grid, summed over its processes).
  int32_t block_tokens = 0;
  KvType kv_type_k = KvType::kF16, kv_type_v = KvType::kF16;
  double kv_bytes_per_token = 0;
  RadixCacheStats tree;
  double HitRate() const { return prompt_tokens ? static_cast<double>(cached_tokens) / prompt_tokens : 0.0; }
};

// Why a request is refused before it is queued: one place checks (Scheduler::Check), each
// caller maps the reason onto its own error (the server onto OpenAI's status, code, param).
enum class Refusal {
  kNone,
  kEmptyPrompt,
  kPromptOverContext,       // prompt length >= n_ctx
  kMaxTokensOverContext,    // prompt + max_tokens > n_ctx, with Request::max_tokens_must_fit
  kPromptOverPool,          // the prompt and its first token need more blocks than the pool has
  kTokenOutsideVocabulary,  // a prompt or forced token id
  kBadParameter,            // max_tokens, sampling, grammar, prompt logits, forced tokens
};

struct Verdict {
  Refusal refusal = Refusal::kNone;
  Status status;  // why, in words (ok when refusal is kNone)
  bool ok() const { return refusal == Refusal::kNone; }
};

class Scheduler {
 public:
  static Result<std::unique_ptr<Scheduler>> Create(const Model& model, const SchedulerOptions& opts, ThreadPool& pool);
  ~Scheduler();

  // Validates and queues a request. Errors (empty prompt, bad ids, prompt longer than the
  // context, prompt larger than the whole pool) are returned at once; nothing is queued.
  // id: 0 = assign the next id; otherwise the caller's (EngineLoop assigns ids itself).
  Result<RequestId> Submit(Request req, TokenCallback on_token, FinishCallback on_finish, RequestId id = 0);
  // The checks Submit makes, without queuing. Reads only immutable state: safe to call
  // from any thread.
  Verdict Check(const Request& req) const;
  Status Validate(const Request& req) const { return Check(req).status; }
  // Finishes the request with kCancelled at the next Step and frees its blocks.
  void Cancel(RequestId id);
  // Finishes every queued and running request with kCancelled now.
  void CancelAll();
  // One scheduling iteration. Returns false when there is nothing to do.
  bool Step();
  void RunUntilIdle();
  bool Idle() const { return running_.empty() && waiting_.empty(); }
  // Store operations whose completions Step has not collected yet.
  bool store_pending() const { return fetching_ > 0 || !pins_.empty(); }

  SchedulerMetrics metrics() const;
  const SchedulerOptions& options() const { return opts_; }
  const Model& model() const { return model_; }
  BlockPool& pool() { return *pool_; }
  RadixCache& cache() { return *cache_; }

 private:
  struct Session;
  struct InFlight {  // a launched batch not yet collected
    std::vector<Session*> sessions;
    std::vector<int32_t> run_len;
    std::vector<uint8_t> sample;  // 1: the run reaches the end of the sequence
    std::vector<int32_t> rows;    // logit rows the run has (its last is the sampled one)
    int64_t tokens = 0;
    double t_launch = 0;
  };
  Scheduler(const Model& model, const SchedulerOptions& opts);

  bool Admit(Session& s);                     // match, acquire, allocate; false if it must wait
  bool ShouldDefer(const Session& s);         // a running prefill will soon cache more of it
  Status EnsureBlocks(Session& s, int64_t n_positions, bool may_preempt);
  int32_t AllocateBlock(Session* requester, bool may_preempt);
  void Preempt(Session& s);
  void InsertFullBlocks(Session& s);
  void CacheFinished(Session& s);  // its full blocks and its partly filled last block
  void ReleaseSession(Session& s);
  void Finish(Session& s, FinishReason reason, Status error = Status::Ok());
  bool LaunchPlanned();               // launches scheduled_/run_len_; false on error
  void CollectOldest();               // collects, samples, finishes
  void FailInFlight(const Status& error, std::span<Session* const> also = {});
  void CheckEpoch();                  // K/V lost outside this process: fail and forget
  Status ConstrainLogits(Session& s);  // the grammar mask applied to logits_buf_
  void StartFetch(Session& s, int32_t first_block, int32_t n_blocks);
  void Publish(Session& s);                           // its computed full blocks, if any
  void PollStore(std::chrono::microseconds wait);     // applies the store's completions
  void ApplyFetch(StoreFetchDone d);
  void SetBlockGeometry(uint64_t& block_bytes, uint32_t& slices, LocalSlice& local) const;
  StoreNamespace StoreNs(const Session& s) const;
  uint64_t Namespace(const Session& s) const;

  const Model& model_;
  SchedulerOptions opts_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<RadixCache> cache_;
  std::unique_ptr<StepExecutor> executor_;
  // Launched batches, oldest first: a ring of depth() records whose buffers are reused,
  // so a step allocates nothing.
  std::vector<InFlight> flights_;
  size_t flight_head_ = 0, n_flights_ = 0;
  InFlight& PushFlight();
  void PopFlight() { flight_head_ = (flight_head_ + 1) % flights_.size(), --n_flights_; }
  uint64_t epoch_ = 0;
  RequestId next_id_ = 1;
  uint64_t admit_counter_ = 0;
  std::deque<std::unique_ptr<Session>> waiting_;
  std::vector<std::unique_ptr<Session>> running_;
  std::vector<std::unique_ptr<Session>> deferred_;  // admission scratch
  std::vector<RequestId> cancel_;
  int32_t fetching_ = 0;                   // sessions waiting for a store fetch
  uint64_t publish_seq_ = 0;
  std::vector<std::pair<uint64_t, std::vector<int32_t>>> pins_;  // publish id -> blocks it holds
  double prefill_s_per_token_ = 0;         // measured, smoothed (0: not yet)
  std::vector<StoreFetchDone> fetch_done_;    // scratch
  std::vector<StorePublishDone> publish_done_;
  SchedulerMetrics m_;
  // Per-step scratch, reserved once.
  std::vector<SeqBatch> batch_;
  std::vector<Session*> scheduled_;
  std::vector<int32_t> run_len_;
  std::vector<int32_t> match_;
  std::vector<int32_t> tail_key_;   // a finished session's tokens, padded to whole blocks
  std::vector<float> logits_buf_;   // (n_vocab) logits being sampled from
  std::vector<float> raw_logits_;   // (n_vocab) copy for Request::logits
};

}  // namespace trellis
