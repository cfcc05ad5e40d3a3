// Scheduler::Session, internal to the scheduler's files (scheduler.cc: admission, steps,
// collection; scheduler_store.cc: fetches from and publishes to the prefix store).
#pragma once

#include <memory>
#include <vector>

#include "engine/scheduler.h"

namespace trellis {

struct Scheduler::Session {
  RequestId id = 0;
  Request req;
  TokenCallback on_token;
  FinishCallback on_finish;
  std::vector<int32_t> tokens;  // prompt, then generated tokens; reserved at submit
  std::vector<int32_t> table;   // KV block ids; this session holds one reference on each
  int32_t n_computed = 0;       // leading positions whose K/V is in `table`
  int32_t n_launched = 0;       // of which, or beyond: positions in batches launched (>= n_computed)
  int32_t in_flight = 0;        // launched batches holding this session, not collected
  int32_t n_tree_blocks = 0;    // leading blocks that are in the radix tree
  NodeId locked = kNoNode;      // deepest tree node this session holds a lock on
  uint64_t admit_order = 0;
  bool admitted_once = false;
  bool preempted = false;       // set during planning; moved back to waiting after
  bool done = false;
  bool fetching = false;        // a store fetch writes into table[fetch_first ..]
  bool cancel_pending = false;  // cancelled while busy (a fetch, batches in flight): finished when they complete
  Status fail_pending;          // failed while its fetch was in flight: finished with this when it lands
  int32_t fetch_first = 0;
  uint64_t fetch_epoch = 0;     // the executor's epoch when the fetch started
  int32_t fetch_want = 0;
  int32_t fetched_upto = 0;     // whole blocks of the prompt a store fetch looked up (claims)
  int32_t reused_blocks = 0;    // whole blocks taken from the tree or the store
  double t_submit = 0;
  Sampler sampler;
  std::unique_ptr<grammar::GrammarMatcher> matcher;  // Request::grammar's state, or null
  grammar::TokenMask mask;
  RequestResult result;

  Session(const SamplerParams& p, int n_vocab) : sampler(p, n_vocab) {}
  int32_t pending() const { return static_cast<int32_t>(tokens.size()) - n_computed; }
  int32_t to_launch() const { return static_cast<int32_t>(tokens.size()) - n_launched; }
  bool busy() const { return fetching || in_flight > 0; }  // its blocks are being written
};

}  // namespace trellis
