#include "engine/scheduler.h"

#include <limits>

#include <algorithm>
#include <bit>

#include <fmt/core.h>

#include "engine/kv_layout.h"
#include "engine/scheduler_session.h"
#include "util/clock.h"
#include "util/log.h"

namespace trellis {


const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContextFull: return "context_full";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

Scheduler::Scheduler(const Model& model, const SchedulerOptions& opts) : model_(model), opts_(opts) {}

Scheduler::~Scheduler() {
  // Batches on other processes write into blocks by id: collect them first.
  while (n_flights_ > 0) {
    (void)executor_->Collect();
    PopFlight();
  }
  // Nothing may write into or read from the pool once it is gone: wait for the store's
  // fetches and publishes (each bounded by its deadline) and take back their blocks.
  if (opts_.store) {
    opts_.store->Drain();
    PollStore(std::chrono::microseconds(0));
  }
  // Sessions hold pool references; drop them before the pool goes away.
  for (auto& s : running_) ReleaseSession(*s);
}

Result<std::unique_ptr<Scheduler>> Scheduler::Create(const Model& model, const SchedulerOptions& in, ThreadPool& pool) {
  SchedulerOptions o = in;
  const ModelConfig& c = model.config();
  TRELLIS_RETURN_IF_ERROR(CheckBlockSize(c, o.block_size));
  TRELLIS_RETURN_IF_ERROR(CheckKvTypes(c, o.kv_type_k, o.kv_type_v));
  if (o.n_ctx <= 0) o.n_ctx = c.DefaultContext();
  if (o.n_ctx > c.MaxContext()) {
    TRELLIS_LOG_WARN("scheduler: a context of {} positions is past the {} this model was trained for: answers past "
                     "position {} may degrade",
                     o.n_ctx, c.MaxContext(), c.MaxContext());
  }
  if (o.env == nullptr) o.env = Env::Default();
  if (o.max_batch_tokens < 1) return InvalidArgument("max batch tokens must be >= 1");
  if (o.prefill_chunk < 1) return InvalidArgument("prefill chunk must be >= 1");
  if (o.max_running < 1) return InvalidArgument("max running sessions must be >= 1");
  if (o.eviction != "lru" && o.eviction != "lfu") return InvalidArgument(fmt::format("eviction policy '{}' (lru, lfu)", o.eviction));
  // The pool is sized by the whole model's block (a grid's nodes keep a pool of the same
  // ids holding their layers); this process's pool holds its own layers only.
  const KvLayout layout = KvLayoutFor(c, o.block_size, o.kv_type_k, o.kv_type_v);
  const int64_t per_ctx = (o.n_ctx + o.block_size - 1) / o.block_size;
  int64_t blocks = o.kv_blocks;
  if (blocks <= 0 && o.kv_memory_bytes > 0) {
    blocks = BlockPool::BlocksForBytes(layout, o.kv_memory_bytes);
    if (blocks <= 0) {
      return InvalidArgument(fmt::format("--kv-memory {} bytes holds no KV block ({} bytes each)", o.kv_memory_bytes, layout.BlockBytes()));
    }
  }
  if (blocks <= 0) blocks = 4 * per_ctx;
  if (blocks > (int64_t{1} << 30)) return InvalidArgument("KV pool too large");
  o.kv_blocks = blocks;

  if (o.prompt_logits && o.executor) return Unsupported("prompt logits need the local executor, not a grid's");
  std::unique_ptr<Scheduler> s(new Scheduler(model, o));
  if (!model.whole() && !o.executor) return InvalidArgument("a part of a model needs an executor for the rest (a grid)");
  if (o.executor && model.RopeFactors(o.n_ctx) != model.RopeFactors(c.DefaultContext())) {
    // A grid's nodes run their layers at the default context's RoPE factor set.
    return Unsupported(fmt::format("a grid runs this LongRoPE model only at contexts using the default context's "
                                   "factor set ({} positions; asked: {})", c.DefaultContext(), o.n_ctx));
  }
  if (!model.whole() && o.store && !o.store->handles_layer_split()) {
    return Unsupported("this prefix store cannot serve a grid (its blocks' layers are spread over processes)");
  }
  TRELLIS_ASSIGN_OR_RETURN(s->pool_, BlockPool::Create(LocalKvLayoutFor(model, o.block_size, o.kv_type_k, o.kv_type_v), static_cast<int32_t>(blocks)));
  s->cache_ = std::make_unique<RadixCache>(s->pool_.get(), o.block_size, static_cast<int32_t>(blocks),
                                           o.eviction == "lfu" ? MakeLfuPolicy() : MakeLruPolicy());
  if (o.executor) {
    TRELLIS_ASSIGN_OR_RETURN(s->executor_, o.executor(s->pool_->view(), static_cast<int32_t>(blocks), o.max_batch_tokens,
                                                      o.max_running, pool));
  } else {
    const int logit_rows = o.max_running + (o.prompt_logits ? o.max_batch_tokens : 0);
    s->executor_ = std::make_unique<LocalExecutor>(model, s->pool_->view(), o.max_batch_tokens, logit_rows, pool, o.n_ctx);
  }
  s->epoch_ = s->executor_->epoch();
  s->flights_.resize(static_cast<size_t>(std::max(1, s->executor_->depth())));
  for (InFlight& f : s->flights_) {
    f.sessions.reserve(static_cast<size_t>(o.max_running));
    f.run_len.reserve(static_cast<size_t>(o.max_running));
    f.sample.reserve(static_cast<size_t>(o.max_running));
    f.rows.reserve(static_cast<size_t>(o.max_running));
  }
  s->batch_.reserve(static_cast<size_t>(o.max_running));
  s->scheduled_.reserve(static_cast<size_t>(o.max_running));
  s->run_len_.reserve(static_cast<size_t>(o.max_running));
  s->match_.reserve(static_cast<size_t>(blocks));
  s->tail_key_.reserve(static_cast<size_t>(o.n_ctx + 2 * o.block_size));
  s->running_.reserve(static_cast<size_t>(o.max_running));
  s->cancel_.reserve(64);
  s->logits_buf_.resize(static_cast<size_t>(c.n_vocab));
  s->raw_logits_.reserve(static_cast<size_t>(c.n_vocab));
  s->m_.pool_total = static_cast<int32_t>(blocks);
  return s;
}

uint64_t Scheduler::Namespace(const Session& s) const {
  return RadixCache::NamespaceKey(model_.KvFingerprint(opts_.n_ctx), s.req.cache_salt);
}

Verdict Scheduler::Check(const Request& req) const {
  const ModelConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  auto refuse = [](Refusal r, Status st) { return Verdict{r, std::move(st)}; };
  if (n == 0) return refuse(Refusal::kEmptyPrompt, InvalidArgument("the prompt is empty"));
  if (n >= opts_.n_ctx) {
    return refuse(Refusal::kPromptOverContext,
                  InvalidArgument(fmt::format("prompt of {} tokens does not fit the context of {} tokens", n, opts_.n_ctx)));
  }
  for (int32_t t : req.prompt) {
    if (t < 0 || t >= c.n_vocab) {
      return refuse(Refusal::kTokenOutsideVocabulary,
                    InvalidArgument(fmt::format("token id {} is outside the vocabulary (0..{})", t, c.n_vocab - 1)));
    }
  }
  if (req.max_tokens < 0) return refuse(Refusal::kBadParameter, InvalidArgument(fmt::format("max_tokens {} is negative", req.max_tokens)));
  if (req.max_tokens_must_fit && n + req.max_tokens > opts_.n_ctx) {
    return refuse(Refusal::kMaxTokensOverContext,
                  InvalidArgument(fmt::format("prompt of {} tokens and max_tokens {} do not fit the context of {} tokens", n,
                                              req.max_tokens, opts_.n_ctx)));
  }
  if (req.prompt_logits && !opts_.prompt_logits) {
    return refuse(Refusal::kBadParameter, InvalidArgument("prompt logits were asked for, but the scheduler was not made "
                                                          "for them (SchedulerOptions::prompt_logits)"));
  }
  for (int32_t t : req.force_tokens) {
    if (t < 0 || t >= c.n_vocab) {
      return refuse(Refusal::kTokenOutsideVocabulary,
                    InvalidArgument(fmt::format("forced token id {} is outside the vocabulary (0..{})", t, c.n_vocab - 1)));
    }
  }
  if (Status st = ValidateSamplerParams(req.sampling); !st.ok()) return refuse(Refusal::kBadParameter, st);
  if (req.grammar) {
    if (req.grammar->vocab().n_vocab() != c.n_vocab) {
      return refuse(Refusal::kBadParameter, InvalidArgument(fmt::format("the grammar's vocabulary has {} tokens, the model {}",
                                                                        req.grammar->vocab().n_vocab(), c.n_vocab)));
    }
    if (!req.force_tokens.empty()) return refuse(Refusal::kBadParameter, InvalidArgument("a grammar and forced tokens together"));
  }
  const int64_t need = (n + opts_.block_size) / opts_.block_size;  // prompt + the first generated token
  if (need > opts_.kv_blocks) {
    return refuse(Refusal::kPromptOverPool,
                  ResourceExhausted(fmt::format("prompt of {} tokens needs {} KV blocks of {}, the pool has {} (raise --kv-memory)",
                                                n, need, opts_.block_size, opts_.kv_blocks)));
  }
  return {};
}

Result<RequestId> Scheduler::Submit(Request req, TokenCallback on_token, FinishCallback on_finish, RequestId id_in) {
  TRELLIS_RETURN_IF_ERROR(Validate(req));
  const ModelConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  auto s = std::make_unique<Session>(req.sampling, c.n_vocab);
  if (req.grammar) {
    TRELLIS_ASSIGN_OR_RETURN(s->matcher, grammar::GrammarMatcher::Make(req.grammar));
    s->mask = grammar::TokenMask(c.n_vocab);
  }
  s->id = id_in != 0 ? id_in : next_id_++;
  const int64_t cap = std::min<int64_t>(opts_.n_ctx + 1, n + std::max(req.max_tokens, 0)) + 1;
  s->tokens.reserve(static_cast<size_t>(cap));
  s->tokens = req.prompt;
  s->table.reserve(static_cast<size_t>(cap / opts_.block_size + 2));
  s->result.tokens.reserve(static_cast<size_t>(std::max(req.max_tokens, 0)));
  s->result.n_prompt = static_cast<int>(n);
  s->req = std::move(req);
  s->on_token = std::move(on_token);
  s->on_finish = std::move(on_finish);
  s->t_submit = opts_.env->NowSeconds();
  const RequestId id = s->id;
  ++m_.requests;
  if (s->req.max_tokens == 0) {
    s->done = true;
    s->result.reason = FinishReason::kLength;
    if (s->on_finish) s->on_finish(id, s->result);
    ++m_.finished;
    return id;
  }
  waiting_.push_back(std::move(s));
  return id;
}

void Scheduler::Cancel(RequestId id) { cancel_.push_back(id); }

void Scheduler::CancelAll() {
  while (n_flights_ > 0) {
    (void)executor_->Collect();
    for (Session* x : flights_[flight_head_].sessions) --x->in_flight;
    PopFlight();
  }
  if (opts_.store) {
    opts_.store->AbandonQueued();
    opts_.store->Drain();
    PollStore(std::chrono::microseconds(0));
  }
  for (auto& s : running_) {
    if (!s->done) Finish(*s, FinishReason::kCancelled);
  }
  running_.clear();
  for (auto& s : waiting_) Finish(*s, FinishReason::kCancelled);
  waiting_.clear();
  cancel_.clear();
}

bool Scheduler::Admit(Session& s) {
  const int B = opts_.block_size;
  const int64_t n = static_cast<int64_t>(s.tokens.size());
  int32_t k = 0;
  const bool reuse = opts_.prefix_cache && !s.req.prompt_logits;  // reused positions have no logits
  if (reuse) {
    match_.clear();
    const NodeId node = cache_->MatchPrefix(Namespace(s), s.tokens, &match_);
    // At least one token must be computed to get logits for the next one, and a shared
    // block is never written: take whole blocks strictly before the last position.
    k = static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(match_.size()), (n - 1) / B));
    cache_->Lock(node);
    s.locked = node;
    for (int32_t i = 0; i < k; ++i) {
      pool_->Acquire(match_[static_cast<size_t>(i)]);
      s.table.push_back(match_[static_cast<size_t>(i)]);
    }
  }
  // Reuse to the token: the next block's leading tokens may be cached too, in a whole
  // block the last position falls inside or in one that matches part of what follows (a
  // finished session's last, partly filled block, or a full one). Its first `j` slots
  // are copied into this session's own first new block: shared blocks are never written.
  int32_t cow_src = BlockPool::kNoBlock, j = 0;
  if (reuse) {
    const int64_t room = (n - 1) - static_cast<int64_t>(k) * B;  // the last position is always computed
    if (static_cast<int64_t>(match_.size()) > k) {
      cow_src = match_[static_cast<size_t>(k)];
      j = static_cast<int32_t>(room);  // < B: k stopped short of a whole matched block
    } else if (room > 0) {
      const auto rest = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(k) * B,
                                                                    static_cast<size_t>(std::min<int64_t>(room, B)));
      const RadixCache::PartialMatch pm = cache_->MatchPartial(s.locked, rest);
      cow_src = pm.block;
      j = std::min(pm.n_tokens, B - 1);
    }
    if (j <= 0) cow_src = BlockPool::kNoBlock, j = 0;
    // Hold the source so eviction below cannot recycle it before the copy.
    if (cow_src != BlockPool::kNoBlock) pool_->Acquire(cow_src);
  }
  const int32_t need = static_cast<int32_t>((n + B - 1) / B) - k;
  if (pool_->n_free() < need) m_.evicted_blocks += cache_->Evict(need);
  if (pool_->n_free() < need) {
    if (cow_src != BlockPool::kNoBlock) pool_->Release(cow_src);
    ReleaseSession(s);  // wait: blocks are short and nothing more can be evicted now
    return false;
  }
  for (int32_t i = 0; i < need; ++i) s.table.push_back(pool_->Allocate());
  if (cow_src != BlockPool::kNoBlock) {
    executor_->CopySlots(*pool_, cow_src, s.table[static_cast<size_t>(k)], j);
    pool_->Release(cow_src);
    ++m_.partial_copies;
  }
  m_.blocks_allocated += need;
  m_.blocks_acquired += k;
  s.n_computed = k * B + j;
  s.n_launched = s.n_computed;
  s.n_tree_blocks = k;
  s.admit_order = ++admit_counter_;
  s.result.n_cached = k * B + j;
  s.reused_blocks = k;
  s.result.cache = CacheReceipt{};
  s.result.cache.local = k * B + j;
  if (!s.admitted_once) {
    m_.prompt_tokens += s.result.n_prompt;
    m_.cached_tokens += k * B + j;
    m_.partial_tokens += j;
  }
  // The store may hold more of the prompt's whole blocks (before its last position).
  const int32_t limit = static_cast<int32_t>((n - 1) / B);
  if (opts_.store && reuse && limit > k) StartFetch(s, k, limit - k);
  s.admitted_once = true;
  return true;
}

void Scheduler::ReleaseSession(Session& s) {
  if (s.locked != kNoNode) {
    cache_->Unlock(s.locked);
    s.locked = kNoNode;
  }
  for (int32_t b : s.table) pool_->Release(b);
  s.table.clear();
  s.n_computed = 0;
  s.n_launched = 0;
  s.n_tree_blocks = 0;
}

void Scheduler::Preempt(Session& s) {
  ReleaseSession(s);  // its full blocks are in the tree: re-admission often finds them
  s.preempted = true;
  ++s.result.n_preempted;
  ++m_.preemptions;
}

// Every block this returns is fresh from the pool and counted once in blocks_allocated,
// whichever path (free list, eviction, preemption) produced it.
int32_t Scheduler::AllocateBlock(Session* requester, bool may_preempt) {
  int32_t id = pool_->Allocate();
  if (id == BlockPool::kNoBlock) {
    m_.evicted_blocks += cache_->Evict(1);
    id = pool_->Allocate();
  }
  while (id == BlockPool::kNoBlock && may_preempt) {
    // Preempt the most recently admitted other session (it has done the least work).
    Session* victim = nullptr;
    for (auto& r : running_) {
      if (r.get() == requester || r->preempted || r->done || r->busy()) continue;
      if (requester && r->admit_order < requester->admit_order) continue;
      if (!victim || r->admit_order > victim->admit_order) victim = r.get();
    }
    if (!victim) break;
    Preempt(*victim);
    m_.evicted_blocks += cache_->Evict(1);
    id = pool_->Allocate();
  }
  if (id != BlockPool::kNoBlock) ++m_.blocks_allocated;
  return id;
}

Status Scheduler::EnsureBlocks(Session& s, int64_t n_positions, bool may_preempt) {
  while (static_cast<int64_t>(s.table.size()) * opts_.block_size < n_positions) {
    const int32_t id = AllocateBlock(&s, may_preempt);
    if (id == BlockPool::kNoBlock) {
      return ResourceExhausted(fmt::format("KV pool exhausted ({} blocks in use)", pool_->n_used()));
    }
    s.table.push_back(id);
  }
  return Status::Ok();
}

void Scheduler::InsertFullBlocks(Session& s) {
  if (!opts_.prefix_cache) return;
  const int B = opts_.block_size;
  const int32_t full = s.n_computed / B;
  if (full <= s.n_tree_blocks) return;
  match_.assign(s.table.begin(), s.table.begin() + full);
  const RadixCache::InsertResult r = cache_->Insert(
      Namespace(s), std::span<const int32_t>(s.tokens.data(), static_cast<size_t>(full) * B), match_);
  // Where another session cached the same tokens first, share its block and drop ours.
  for (int32_t i = s.n_tree_blocks; i < full; ++i) {
    const int32_t cached = match_[static_cast<size_t>(i)];
    if (cached != s.table[static_cast<size_t>(i)]) {
      pool_->Acquire(cached);
      pool_->Release(s.table[static_cast<size_t>(i)]);
      s.table[static_cast<size_t>(i)] = cached;
      ++m_.blocks_acquired;
    }
  }
  cache_->Lock(r.node);
  if (s.locked != kNoNode) cache_->Unlock(s.locked);
  s.locked = r.node;
  s.n_tree_blocks = full;
}

// A finished session's K/V stays useful: the next turn of a conversation starts with
// everything it computed (prompt and reply). Its full blocks are in the tree already; its
// last, partly filled block goes in too, keyed by its tokens padded with kPad, so a later
// prompt can copy its prefix (MatchPartial). The block is never written again.
void Scheduler::CacheFinished(Session& s) {
  if (!opts_.prefix_cache || s.table.empty() || s.n_computed <= 0) return;
  InsertFullBlocks(s);
  const int B = opts_.block_size;
  const int32_t full = s.n_computed / B;
  const int32_t rem = s.n_computed % B;
  if (rem == 0 || static_cast<size_t>(full) >= s.table.size()) return;
  tail_key_.assign(s.tokens.begin(), s.tokens.begin() + static_cast<int64_t>(full) * B + rem);
  tail_key_.resize(static_cast<size_t>(full + 1) * B, RadixCache::kPad);
  match_.assign(s.table.begin(), s.table.begin() + full + 1);
  // Where the same tokens are cached already, the tree keeps its block; ours is released
  // with the session's other references.
  cache_->Insert(Namespace(s), tail_key_, match_);
}

void Scheduler::Finish(Session& s, FinishReason reason, Status error) {
  if (reason != FinishReason::kError) CacheFinished(s);
  // What it generated, for the next turn on any node (not when cancelled: shutting down
  // must not wait for the store).
  if (reason != FinishReason::kError && reason != FinishReason::kCancelled) Publish(s);
  // Ended before publishing what its fetch looked up (and may have claimed): give the
  // claims up, so other engines compute those blocks now rather than wait for them.
  if (opts_.store && s.fetched_upto > s.reused_blocks) {
    opts_.store->GiveUp(StoreNs(s), std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + static_cast<int64_t>(s.fetched_upto) * opts_.block_size));
  }
  ReleaseSession(s);
  s.done = true;
  s.result.reason = reason;
  s.result.error = std::move(error);
  s.result.total_seconds = opts_.env->NowSeconds() - s.t_submit;
  if (reason == FinishReason::kCancelled) ++m_.cancelled;
  ++m_.finished;
  if (s.on_finish) s.on_finish(s.id, s.result);
}

bool Scheduler::Step() {
  CheckEpoch();
  // Cancellations. A session whose blocks are being written (a store fetch, a batch in
  // flight) is finished once that completes.
  for (RequestId id : cancel_) {
    for (auto& s : running_) {
      if (s->id != id || s->done) continue;
      if (s->busy()) {
        s->cancel_pending = true;
      } else {
        Finish(*s, FinishReason::kCancelled);
      }
    }
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->id == id) {
        Finish(**it, FinishReason::kCancelled);
        waiting_.erase(it);
        break;
      }
    }
  }
  cancel_.clear();
  PollStore(std::chrono::microseconds(0));
  std::erase_if(running_, [](const auto& s) { return s->done; });

  // Admission, in arrival order (preempted sessions were put back at the front). A
  // request that shares more with a session still computing its prompt than the tree
  // holds yet waits for those blocks instead of computing them a second time.
  deferred_.clear();
  while (!waiting_.empty() && static_cast<int>(running_.size()) < opts_.max_running) {
    if (opts_.prefix_cache && !waiting_.front()->req.prompt_logits && ShouldDefer(*waiting_.front())) {
      deferred_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      continue;
    }
    if (!Admit(*waiting_.front())) {
      if (running_.empty()) {
        // Nothing holds a lock, so everything evictable was evicted: this sequence (a
        // preempted one that grew) can never fit the pool. End it rather than wait forever.
        Finish(*waiting_.front(), FinishReason::kContextFull);
        waiting_.pop_front();
        continue;
      }
      break;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  for (auto it = deferred_.rbegin(); it != deferred_.rend(); ++it) waiting_.push_front(std::move(*it));
  deferred_.clear();
  if (running_.empty()) return !waiting_.empty();

  // Plan: decode tokens first, oldest session first (a decode may preempt younger
  // sessions for a block), then prefill chunks in admission order. A session takes part
  // when it has tokens not launched yet: a decode once its last batch is collected, a
  // prefill chunk also while its previous chunk is still in the pipeline. With several
  // micro-batches in flight, the decodes ready now are shared among the free slots.
  const int free_slots = std::max(1, executor_->depth() - static_cast<int>(n_flights_));
  int ready_decodes = 0;
  for (auto& sp : running_) {
    ready_decodes += (!sp->preempted && !sp->fetching && !sp->cancel_pending && sp->to_launch() == 1) ? 1 : 0;
  }
  int decode_cap = (ready_decodes + free_slots - 1) / free_slots;
  int budget = opts_.max_batch_tokens;
  scheduled_.clear();
  run_len_.clear();
  for (auto& sp : running_) {
    Session& s = *sp;
    if (s.preempted || s.fetching || s.cancel_pending || s.to_launch() != 1 || budget == 0 || decode_cap == 0) continue;
    Status st = EnsureBlocks(s, s.n_launched + 1, /*may_preempt=*/true);
    if (!st.ok()) {
      bool alone = true;
      for (auto& r : running_) alone &= (r.get() == &s || r->preempted || r->done);
      if (s.in_flight > 0) {
        continue;  // its previous chunk is still being computed: try again next step
      } else if (alone) {
        Finish(s, FinishReason::kContextFull);  // the whole pool cannot hold it
      } else {
        Preempt(s);  // the youngest yields to older sessions and resumes later
      }
      continue;
    }
    scheduled_.push_back(&s);
    run_len_.push_back(1);
    --budget;
    --decode_cap;
  }
  for (auto& sp : running_) {
    Session& s = *sp;
    // (A cancelled session launches nothing more; it ends when its batches are back.)
    if (s.preempted || s.done || s.fetching || s.cancel_pending || s.to_launch() <= 1 || budget == 0) continue;
    int32_t chunk = opts_.prefill_chunk;
    if (executor_->depth() > 1) {
      // In a pipeline a prompt's chunks overlap on the stages, so what is left is cut in
      // four or more (never below 16 tokens, and never leaving fewer than 16 after): a
      // short prompt, or the rest after a cached prefix, is pipelined too instead of
      // crossing every stage as one piece.
      chunk = std::min(chunk, std::max<int32_t>(16, (s.to_launch() + 3) / 4));
      // No chunk of a few tokens at the end: each costs a pass over every stage's weights.
      if (s.to_launch() - chunk < 16) chunk = std::min(opts_.prefill_chunk, s.to_launch());
    }
    const int32_t n = std::min({s.to_launch(), chunk, budget});
    if (!EnsureBlocks(s, s.n_launched + n, /*may_preempt=*/false).ok()) continue;  // admission reserved them
    scheduled_.push_back(&s);
    run_len_.push_back(n);
    budget -= n;
  }
  // Preempted sessions go back to the front of the queue, oldest first.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if ((*it)->preempted && !(*it)->done) {
      (*it)->preempted = false;
      waiting_.push_front(std::move(*it));
    }
  }
  std::erase_if(running_, [](const auto& s) { return s == nullptr || s->done; });

  const bool launched = !scheduled_.empty() && n_flights_ < flights_.size() && LaunchPlanned();
  // Collect when the pipeline is full, or when nothing more could be launched.
  if (n_flights_ > 0 && (n_flights_ >= flights_.size() || !launched)) {
    CollectOldest();
  } else if (!launched && fetching_ > 0) {
    PollStore(std::chrono::microseconds(1000));  // only store fetches in flight: wait a little
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
  return !Idle() || n_flights_ > 0;
}

Scheduler::InFlight& Scheduler::PushFlight() {
  InFlight& f = flights_[(flight_head_ + n_flights_) % flights_.size()];
  ++n_flights_;
  f.sessions.clear();
  f.run_len.clear();
  f.sample.clear();
  f.rows.clear();
  f.tokens = 0;
  f.t_launch = opts_.env->NowSeconds();
  return f;
}

bool Scheduler::LaunchPlanned() {
  batch_.clear();
  InFlight& f = PushFlight();
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    Session& s = *scheduled_[i];
    const int32_t n = run_len_[i];
    SeqBatch sb;
    sb.tokens = std::span<const int32_t>(s.tokens.data() + s.n_launched, static_cast<size_t>(n));
    sb.pos0 = s.n_launched;
    sb.block_table = s.table;
    const bool reaches_end = s.n_launched + n == static_cast<int32_t>(s.tokens.size());
    // A prompt-logits session's prompt chunk: a row for each position (the last is the
    // one sampled from when the chunk reaches the end).
    const bool all_rows = s.req.prompt_logits && s.n_launched < s.result.n_prompt;
    sb.n_logits = all_rows ? n : reaches_end ? 1 : 0;
    batch_.push_back(sb);
    f.sessions.push_back(&s);
    f.run_len.push_back(n);
    f.sample.push_back(static_cast<uint8_t>(reaches_end));
    f.rows.push_back(sb.n_logits);
    f.tokens += n;
  }
  Status st = executor_->Launch(batch_);
  ++m_.steps;
  if (!st.ok()) {
    --n_flights_;  // the record just pushed: nothing of it is in flight
    TRELLIS_LOG_ERROR("scheduler: forward failed: {}", st.ToString());
    FailInFlight(st, scheduled_);
    return false;
  }
  for (size_t i = 0; i < f.sessions.size(); ++i) {
    f.sessions[i]->n_launched += f.run_len[i];
    ++f.sessions[i]->in_flight;
  }
  return true;
}

// Fails every session of every batch in flight (after collecting them: no write may land
// in a block after it is released) and the sessions in `also`.
void Scheduler::FailInFlight(const Status& error, std::span<Session* const> also) {
  std::vector<Session*> failed(also.begin(), also.end());
  while (n_flights_ > 0) {
    (void)executor_->Collect();
    for (Session* s : flights_[flight_head_].sessions) {
      --s->in_flight;
      failed.push_back(s);
    }
    PopFlight();
  }
  for (Session* s : failed) {
    if (s->done) continue;
    // A store fetch still writes into its blocks (here, and on grid nodes): they stay its
    // own until the fetch lands, and it fails then (ApplyFetch).
    if (s->fetching) {
      if (s->fail_pending.ok()) s->fail_pending = error;
      continue;
    }
    Finish(*s, FinishReason::kError, error);
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
}

void Scheduler::CollectOldest() {
  Status st = executor_->Collect();
  InFlight& f = flights_[flight_head_];  // popped at the end: nothing is launched meanwhile
  for (Session* s : f.sessions) --s->in_flight;
  if (!st.ok()) {
    TRELLIS_LOG_ERROR("scheduler: forward failed: {}", st.ToString());
    const std::vector<Session*> failed = f.sessions;
    PopFlight();
    FailInFlight(st, failed);
    return;
  }
  {
    // The prefill rate, for deciding whether reading a prefix from the store is quicker
    // than computing it: from batches that are mostly prefill.
    if (f.tokens >= 16 && f.tokens >= 4 * static_cast<int64_t>(f.run_len.size())) {
      const double x = (opts_.env->NowSeconds() - f.t_launch) / static_cast<double>(f.tokens);
      prefill_s_per_token_ = prefill_s_per_token_ <= 0 ? x : 0.75 * prefill_s_per_token_ + 0.25 * x;
    }
  }

  const int n_vocab = model_.config().n_vocab;
  int logit_row = 0;
  for (size_t i = 0; i < f.sessions.size(); ++i) {
    Session& s = *f.sessions[i];
    const bool sample = f.sample[i] != 0;
    const int32_t rows = f.rows[i];
    const int first_row = logit_row;
    logit_row += rows;
    if (s.req.prompt_logits && s.n_computed < s.result.n_prompt) {
      // Prompt rows: positions [n_computed, n_computed + rows) of the prompt.
      s.result.prompt_logits.resize(static_cast<size_t>(s.result.n_prompt) * n_vocab);
      for (int32_t r = 0; r < rows && s.n_computed + r < s.result.n_prompt; ++r) {
        std::copy_n(executor_->logits_row(first_row + r), n_vocab,
                    s.result.prompt_logits.data() + static_cast<size_t>(s.n_computed + r) * n_vocab);
      }
    }
    s.n_computed += f.run_len[i];
    m_.computed_tokens += f.run_len[i];
    if (s.done) continue;
    InsertFullBlocks(s);
    if (!sample) {
      // Mid-prefill: what this chunk completed goes to the store now, so another node
      // waiting on this prefix (single-flight) reads it as it is made, not at the end.
      Publish(s);
      if (s.cancel_pending && s.in_flight == 0) Finish(s, FinishReason::kCancelled);
      continue;
    }
    const float* row = executor_->logits_row(first_row + rows - 1);
    if (s.cancel_pending) {
      Finish(s, FinishReason::kCancelled);
      continue;
    }
    if (s.result.tokens.empty()) {
      // The prompt is in: what was not reused was computed, and its new blocks are
      // offered to the store now, not only when the request ends.
      s.result.cache.computed = s.result.n_prompt - s.result.cache.local - s.result.cache.store;
      Publish(s);
    }
    std::copy_n(row, n_vocab, logits_buf_.data());
    if (s.req.logits && s.on_token) {
      // Report the raw logits (before penalties) with the token sampled from them.
      raw_logits_.assign(logits_buf_.begin(), logits_buf_.end());
    }
    const size_t step = s.result.tokens.size();
    if (s.matcher) {
      if (Status st = ConstrainLogits(s); !st.ok()) {
        Finish(s, FinishReason::kError, st);
        continue;
      }
    }
    const int32_t tok = step < s.req.force_tokens.size()
                            ? s.req.force_tokens[step]
                            : s.sampler.Sample(logits_buf_, s.tokens, static_cast<size_t>(s.result.n_prompt));
    if (s.matcher) {
      if (Status st = s.matcher->Accept(tok); !st.ok()) {
        Finish(s, FinishReason::kError,
               InvalidArgument("no token the grammar allows is left to sample (logit_bias bans them all?): " + st.message()));
        continue;
      }
    }
    if (s.result.tokens.empty()) s.result.ttft_seconds = opts_.env->NowSeconds() - s.t_submit;
    s.tokens.push_back(tok);
    s.result.tokens.push_back(tok);
    ++m_.generated_tokens;
    if (s.on_token) {
      s.on_token(s.id, tok, s.req.logits ? std::span<const float>(raw_logits_) : std::span<const float>());
    }
    if (s.req.is_stop && s.req.is_stop(tok)) {
      Finish(s, FinishReason::kStop);
    } else if (static_cast<int>(s.result.tokens.size()) >= s.req.max_tokens) {
      Finish(s, FinishReason::kLength);
    } else if (static_cast<int>(s.tokens.size()) > opts_.n_ctx) {
      // Positions 0 .. n_ctx - 1 were all fed; the token drawn from the last of them has
      // no position to be fed at (llama.cpp's rule: n_ctx positions, one more token).
      Finish(s, FinishReason::kContextFull);
    }
  }
  PopFlight();
}

// Sets the logits of the tokens the grammar does not allow next to -inf (logits_buf_).
Status Scheduler::ConstrainLogits(Session& s) {
  const double t0 = opts_.env->NowSeconds();
  TRELLIS_RETURN_IF_ERROR(s.matcher->FillMask(s.mask));
  const std::span<const uint64_t> words = s.mask.words();
  const size_t n = logits_buf_.size();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < words.size(); ++w) {
    uint64_t allowed = words[w];
    if (allowed == ~uint64_t{0}) continue;
    const size_t begin = w * 64, end = std::min(n, begin + 64);
    if (allowed == 0) {
      std::fill(logits_buf_.begin() + static_cast<ptrdiff_t>(begin), logits_buf_.begin() + static_cast<ptrdiff_t>(end),
                kNegInf);
      continue;
    }
    uint64_t refused = ~allowed;
    if (end - begin < 64) refused &= (uint64_t{1} << (end - begin)) - 1;
    for (; refused; refused &= refused - 1) logits_buf_[begin + static_cast<size_t>(std::countr_zero(refused))] = kNegInf;
  }
  ++m_.grammar_masks;
  m_.grammar_mask_seconds += opts_.env->NowSeconds() - t0;
  return Status::Ok();
}

// K/V held by another process was lost (a grid node restarted): every running session's
// blocks, and every cached prefix, are incomplete there. Fail the sessions with a clear
// error and forget the cache rather than serve answers computed on lost K/V.
void Scheduler::CheckEpoch() {
  const uint64_t e = executor_->epoch();
  if (e == epoch_) return;
  epoch_ = e;
  const Status lost = Unavailable("a grid node restarted and its K/V was lost; the request was stopped");
  std::vector<Session*> all;
  for (auto& s : running_) all.push_back(s.get());
  FailInFlight(lost, all);
  m_.evicted_blocks += cache_->Evict(pool_->n_blocks());
  TRELLIS_LOG_WARN("scheduler: K/V lost on a grid node; {} running requests failed, the prefix cache was cleared", all.size());
}

void Scheduler::RunUntilIdle() {
  while (Step()) {
  }
}

SchedulerMetrics Scheduler::metrics() const {
  SchedulerMetrics m = m_;
  m.running = static_cast<int32_t>(running_.size());
  m.waiting = static_cast<int32_t>(waiting_.size());
  m.pool_used = pool_->n_used();
  m.pool_total = pool_->n_blocks();
  m.block_tokens = opts_.block_size;
  m.kv_type_k = opts_.kv_type_k;
  m.kv_type_v = opts_.kv_type_v;
  m.kv_bytes_per_token = static_cast<double>(KvLayoutFor(model_.config(), opts_.block_size, opts_.kv_type_k, opts_.kv_type_v).BlockBytes()) /
                         opts_.block_size;
  m.tree = cache_->stats();
  m.store_publishes_in_flight = static_cast<int32_t>(pins_.size());
  return m;
}

}  // namespace trellis
