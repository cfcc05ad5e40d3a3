// GridPrefixStore: a grid head's prefix store (docs/grid.md, "The store"). A block's
// layers are spread over the head and its nodes, so a fetch has every node read its
// layers' byte range of each stored block straight into its pool while the head reads its
// own, and a publish gathers the nodes' layers into whole blocks before the put. It is
// the store bridge (engine/store_bridge.h: lookups, claims, timeouts, threads) with this
// grid's block I/O; the scheduler sees a PrefixStore like any other.
//
// The head is made by the scheduler (MakeGridExecutor), after the store: it is attached
// then (Attach); until it is, fetches and publishes fail (misses, nothing stored).
//
// Thread safety: as StoreBridge; Attach from the engine thread, read by the bridge's.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "engine/store_bridge.h"

namespace trellis::grid {

class GridHead;

class GridPrefixStore final : public PrefixStore {
 public:
  // options.reader and options.gather are this class's; anything set there is replaced.
  static Result<std::unique_ptr<GridPrefixStore>> Connect(StoreBridgeOptions options);
  ~GridPrefixStore() override;

  void Attach(GridHead* head) { head_.store(head, std::memory_order_release); }
  StoreBridge& bridge() { return *bridge_; }

  void StartFetch(StoreFetch f) override { bridge_->StartFetch(std::move(f)); }
  void StartPublish(StorePublish p) override { bridge_->StartPublish(std::move(p)); }
  void GiveUp(const StoreNamespace& ns, std::vector<int32_t> tokens) override { bridge_->GiveUp(ns, std::move(tokens)); }
  void Poll(std::vector<StoreFetchDone>* fetched, std::vector<StorePublishDone>* published,
            std::chrono::microseconds wait) override {
    bridge_->Poll(fetched, published, wait);
  }
  void Drain() override { bridge_->Drain(); }
  void AbandonQueued() override { bridge_->AbandonQueued(); }
  size_t in_flight() const override { return bridge_->in_flight(); }
  bool handles_layer_split() const override { return true; }

 private:
  GridPrefixStore() = default;
  // The bridge's reader and gather (its threads).
  Status Read(store::StoreClient& client, const store::LookupResult& found, size_t first, size_t from, size_t to,
              const StoreFetch& f, net::Deadline deadline, store::GetReceipt* receipt);
  Status Gather(const StorePublish& p, size_t from, size_t to, uint8_t* out, net::Deadline deadline);

  std::atomic<GridHead*> head_{nullptr};
  std::unique_ptr<StoreBridge> bridge_;  // last: its threads stop before head_ goes
};

}  // namespace trellis::grid
