// StepExecutor: how the scheduler runs a batch through the model.
//
// The scheduler plans a batch, Launches it, and later Collects it, oldest first. An
// executor that computes in this process (LocalExecutor) finishes the batch inside Launch
// and keeps one in flight; one that hands batches to other processes (the grid's head:
// grid/head.h) returns from Launch as soon as its own share is done, so the scheduler can
// plan and launch the next micro-batch while the first is still on other nodes.
//
// K/V ownership: the scheduler owns block ids (allocation, sharing, eviction) in its
// pool. A copy-on-write of a block prefix goes through CopySlots so that every process
// holding a share of each block applies it, ordered before any batch launched after it.
//
// Thread safety: the engine thread calls everything.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "engine/forward.h"
#include "kv/block_pool.h"
#include "util/status.h"

namespace trellis {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;

  // Batches that may be in flight at once (>= 1).
  virtual int depth() const = 0;
  // Starts a batch; what it needs of `seqs` (tokens, block tables) is used or copied
  // before it returns. On error nothing of this batch is in flight.
  virtual Status Launch(std::span<const SeqBatch> seqs) = 0;
  // Waits for the oldest launched batch. On success logits_row(i) holds its i-th logit
  // row (sequences in batch order) until the next Collect. REQUIRES: a batch in flight.
  virtual Status Collect() = 0;
  virtual const float* logits_row(int i) const = 0;
  // Copies the K/V of slots [0, n_slots) of block src into block dst, every layer,
  // wherever the layers live.
  virtual void CopySlots(BlockPool& pool, int32_t src, int32_t dst, int32_t n_slots) = 0;
  // Changes whenever K/V held outside this process was lost (a grid node restarted): the
  // content of every block is then unknown and the scheduler drops its cache.
  virtual uint64_t epoch() const { return 0; }
};

// Runs the whole model in this process.
class LocalExecutor final : public StepExecutor {
 public:
  LocalExecutor(const Model& model, const PagedKv& kv, int max_batch_tokens, int max_logit_rows, ThreadPool& pool,
                int n_ctx = 0)
      : forward_(model, kv, max_batch_tokens, max_logit_rows, pool, n_ctx) {}
  int depth() const override { return 1; }
  Status Launch(std::span<const SeqBatch> seqs) override { return forward_.Run(seqs); }
  Status Collect() override { return Status::Ok(); }
  const float* logits_row(int i) const override { return forward_.logits_row(i); }
  void CopySlots(BlockPool& pool, int32_t src, int32_t dst, int32_t n_slots) override {
    pool.CopySlots(src, dst, n_slots);
  }

 private:
  Forward forward_;
};

// Makes the scheduler's executor once its pool exists: kv is the pool's view (this
// process's layers of every block), n_blocks its size in blocks.
using ExecutorFactory = std::function<Result<std::unique_ptr<StepExecutor>>(const PagedKv& kv, int32_t n_blocks,
                                                                           int max_batch_tokens, int max_logit_rows,
                                                                           ThreadPool& pool)>;

}  // namespace trellis
