// GridNode: one process of a grid (docs/grid.md). It holds a range of the model's layers
// (ModelPart) and, once a head says Hello, a KV pool of the head's geometry holding its
// layers' slice of every block. Each Step carries the block copies to apply, the batch's
// sequences (positions and block tables) and the hidden state entering the node's first
// layer; the node runs its layers and answers with the hidden state after its last.
//
// A node serves one head at a time: a Hello (from a new head, or the same one after a
// failure) resets it, and steps from any other head are refused. Steps run in the order
// of their sequence numbers, whatever order they arrive in. A Hello whose model
// fingerprint or layer range differs from the node's is refused, with both in the error.
//
// With a store, a head's Fetch has the node read its layers' byte range of stored blocks
// straight into its pool, and a Read returns its layers of blocks the head publishes.
//
// Threads: the transport's loop thread receives, checks and queues; one compute thread
// (with its kernel thread pool) runs steps and posts the replies back to the loop; two
// store threads run fetches and reads (a Hello waits for those in progress before it
// touches the pool).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "engine/model.h"
#include "net/transport.h"
#include "store/client.h"
#include "util/status.h"

namespace trellis::grid {

struct NodeOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any
  net::TransportOptions transport;
  int threads = 1;    // kernel threads
  // What a head may ask for at Hello: a KV pool of at most this many bytes (0: 90% of
  // the memory available when it asks) and steps of at most this many tokens (each
  // sizes the node's activations).
  uint64_t max_kv_bytes = 0;
  // The K/V types this node holds (KvLayout::TypeCode()); -1: whichever the head asks.
  int64_t kv_types = -1;
  uint32_t max_batch_tokens = 8192;
  // The prefix store (docs/store.md), for a head that reads prefixes from it: the node
  // reads its layers of each block itself. Unused when store.servers and store.etcd are
  // empty; a head with a store is then refused at Hello.
  store::ClientOptions store;
  std::chrono::milliseconds store_connect_timeout{5000};
};

struct NodeStats {
  uint64_t hellos = 0, refused_hellos = 0;
  uint64_t steps = 0, tokens = 0, refused_steps = 0;
  double compute_seconds = 0;
  uint64_t kv_pool_bytes = 0;
  // The store: fetches run (and blocks they read into the pool), fetches that failed,
  // and blocks given to the head for publishing.
  uint64_t fetches = 0, fetched_blocks = 0, fetch_failures = 0, read_blocks = 0;
};

class GridNode {
 public:
  // Borrows the model part, which must outlive the node.
  static Result<std::unique_ptr<GridNode>> Start(const Model& model, const NodeOptions& options);
  ~GridNode();
  GridNode(const GridNode&) = delete;
  GridNode& operator=(const GridNode&) = delete;

  uint16_t port() const;
  NodeStats stats() const;
  // Tests only: runs at two points of the store's jobs, on the thread doing them:
  // "fetch-landed" as each segment of a fetch lands in the pool (before the fetch
  // completes), "read" when a head's read is copied out, before the answer is sent. A
  // test that kills the process there has it die exactly mid-fetch or mid-read.
  void SetFaultHookForTesting(std::function<void(std::string_view where)> hook);

  struct Impl;

 private:
  explicit GridNode(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::grid
