// GridHead: the scheduler's executor when the model's layers are spread over nodes
// (docs/grid.md). The head holds the embeddings, the output head and optionally the first
// layers; the nodes hold the rest, in order. For each batch the head embeds and runs its
// layers on the engine thread, then hands the hidden state to node 1, node 1's answer to
// node 2, and so on, from the transport's loop thread; the last answer becomes logits
// when the scheduler collects the batch. Launch returns as soon as the head's share is
// done, so with depth() micro-batches in flight every node works on a different one.
//
// Block ids are the scheduler's: every node's pool has the same ids and holds its layers'
// slice of each block. Copy-on-write copies travel with the next step and every node
// applies them before computing. Steps carry a per-node sequence number and nodes run
// them in that order.
//
// Faults: a node that fails a step, dies, or does not answer within step_timeout fails
// every batch in flight with Unavailable naming the node; health() reports it and the
// head stays unhealthy (Launch fails at once) while it reconnects in the background. When
// every node is back, epoch() changes: the scheduler drops its cache, whose K/V the
// restarted node no longer has. A node whose model fingerprint or layer range differs
// from the head's is refused at Hello.
//
// Threading: Launch, Collect, CopySlots, epoch on the engine thread; health and stats
// from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/step_executor.h"
#include "engine/store_bridge.h"
#include "net/transport.h"
#include "store/client.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace trellis::grid {

struct NodeAddress {
  std::string host;
  uint16_t port = 0;
  int first_layer = 0, last_layer = 0;  // [first, last)
  std::string Name() const;             // "host:port (layers a-b)"
};

// "HOST:PORT=A-B,HOST:PORT=C-D" (layer ranges inclusive, as users write them).
Result<std::vector<NodeAddress>> ParseGridSpec(const std::string& spec);

struct HeadOptions {
  std::vector<NodeAddress> nodes;  // in layer order; the head holds [0, nodes[0].first_layer)
  net::TransportOptions transport;
  int depth = 2;                   // micro-batches in flight
  std::chrono::milliseconds step_timeout{60000};  // one node's answer to one step
  std::chrono::milliseconds start_timeout{30000}; // Create waits this long for every node
  std::chrono::milliseconds retry_interval{1000}; // reconnecting to a failed node
  int n_ctx = 0;
  int max_seqs = 0;
  bool store = false;  // prefixes come from a store: every node must have one (Hello)
};

struct HeadHealth {
  bool ok = true;
  std::string message;  // which node failed and why, when !ok
};

struct HeadStats {
  uint64_t steps = 0, tokens = 0;  // launched
  uint64_t bytes_sent = 0;         // step bodies, to every node
  uint64_t bytes_received = 0;
  uint64_t node_failures = 0, rejoins = 0;
  // Where the engine thread's time goes: its own layers (in Launch), waiting for the
  // nodes (in Collect), the output head (in Collect).
  double layers_seconds = 0, wait_seconds = 0, logits_seconds = 0;
  // Each node's link, measured at connect: round trip of an empty message (median of
  // 16), and bytes per second from the round trip of 1 MiB each way (median of 8).
  std::vector<double> rtt_seconds, bandwidth;
  // The store: fetches the nodes ran for the head (each node counted once per fetch),
  // and bytes gathered from the nodes for publishing.
  uint64_t node_fetches = 0, node_fetch_failures = 0, gathered_bytes = 0;
  // Copy-on-write slot copies sent with steps, and those dropped because they were queued
  // on an epoch that ended (a node failed before they could be sent).
  uint64_t copies_sent = 0, copies_dropped = 0;
  // Each node, in layer order: up or not, the steps it answered, their time from sending
  // to the answer (both links and its layers), and the times it was declared failed.
  struct Node {
    std::string address;  // host:port
    int first_layer = 0, last_layer = 0;
    bool up = false;
    uint64_t steps = 0, failures = 0;
    double step_seconds = 0;
  };
  std::vector<Node> nodes;
};

class GridHead final : public StepExecutor {
 public:
  // Connects to every node (retrying until start_timeout) and says Hello. `model` is the
  // head's part; kv its pool (the head's layers); n_blocks the pool's size in blocks.
  static Result<std::unique_ptr<GridHead>> Create(const Model& model, const PagedKv& kv, int32_t n_blocks,
                                                  int max_batch_tokens, int max_logit_rows, ThreadPool& threads,
                                                  const HeadOptions& options);
  ~GridHead() override;

  int depth() const override;
  Status Launch(std::span<const SeqBatch> seqs) override;
  Status Collect() override;
  const float* logits_row(int i) const override;
  void CopySlots(BlockPool& pool, int32_t src, int32_t dst, int32_t n_slots) override;
  uint64_t epoch() const override;

  HeadHealth health() const;
  HeadStats stats() const;

  // The prefix store (docs/grid.md, "The store"), from the store bridge's threads.
  // Has every node read blocks [first, first + ids.size()) of a stored prefix (the
  // head's lookup), its layers' byte range of each, straight into its pool blocks `ids`.
  // Waits for every node; fails unless every node read all of them. A node that does not
  // answer by the deadline (plus a grace) is failed like a node that misses a step: it
  // may still be writing.
  Status FetchOnNodes(const store::LookupResult& found, size_t first, std::span<const int32_t> ids,
                      uint64_t block_bytes, uint32_t slices, net::Deadline deadline, store::GetReceipt* receipt);
  // Writes every node's layers of blocks `ids` into `out` (whole blocks of block_bytes,
  // back to back; the head's own layers are the caller's). Fails if K/V was lost on a
  // node since `epoch` (what was read could be a restarted node's empty pool).
  Status GatherFromNodes(std::span<const int32_t> ids, uint64_t block_bytes, uint8_t* out, uint64_t epoch,
                         net::Deadline deadline);
  // epoch() without marking it seen (for threads other than the engine's).
  uint64_t current_epoch() const;

  struct Impl;

 private:
  explicit GridHead(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class GridPrefixStore;

// The scheduler's ExecutorFactory for a grid head. `out`, if given, receives the head
// once made (borrowed: the scheduler owns it); `store`, if given, is attached to it (the
// grid's prefix store, grid/prefix_store.h).
ExecutorFactory MakeGridExecutor(const Model& model, HeadOptions options, GridHead** out = nullptr,
                                 GridPrefixStore* store = nullptr);

}  // namespace trellis::grid
