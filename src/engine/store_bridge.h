// StoreBridge: the engine's PrefixStore (kv/prefix_store.h) on the prefix tensor store
// (src/store, docs/store.md).
//
// Two threads of its own: one runs fetches (lookup, then one bulk read straight into the
// session's pool blocks), one runs publishes (the blocks past the longest stored prefix,
// as one new tensor), so a large publish never delays a fetch. Every call has a
// deadline; a store that is down, slow or answers nonsense is a miss with a typed
// reason, never an error for the request and never a hang.
//
// Whether a fetch is worth making is decided per request: the estimated read time (bytes
// over the get bandwidth measured on recent reads, plus a lookup round trip) against the
// engine's estimated compute time for the same blocks. The bandwidth is measured at
// start (a read of a probe tensor) and kept current with every read.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/prefix_store.h"
#include "store/client.h"

namespace trellis {

struct StoreBridgeOptions {
  store::ClientOptions client;
  // The longest a fetch may take (lookup and read); less when computing the blocks is
  // estimated to be quicker.
  std::chrono::milliseconds fetch_timeout{2000};
  // Added to the compute estimate when it bounds a fetch (the estimate of a small model's
  // few blocks is microseconds; a lookup's round trip is not).
  std::chrono::milliseconds compute_bound_slack{5};
  std::chrono::milliseconds publish_timeout{10000};
  std::chrono::milliseconds connect_timeout{3000};
  size_t max_queued_publishes = 64;  // past this, publishes are dropped (counted)
  // Single-flight across nodes: a fetch claims the blocks its engine is about to compute
  // (others wait for them), and waits for blocks another engine claimed, as long as
  // computing them here would take (then computes them itself).
  bool single_flight = true;
  int fetch_threads = 4;  // fetches run (and wait) side by side

  // A grid head (docs/grid.md): the layers of each block are spread over processes.
  // reader reads fetch f's blocks [from, to) (indices into f.dst), which are blocks
  // first, first + 1, ... of the lookup's prefix: every process its own byte range,
  // straight into its pool. gather fills `out` with whole blocks [from, to) of publish
  // p (block_bytes each, every layer), its own range from p.blocks and the others' from
  // their processes. Both run on the bridge's threads and fail (a miss, a failed
  // publish) unless every process succeeded within the deadline.
  std::function<Status(store::StoreClient& client, const store::LookupResult& found, size_t first, size_t from,
                       size_t to, const StoreFetch& f, net::Deadline deadline, store::GetReceipt* receipt)>
      reader;
  std::function<Status(const StorePublish& p, size_t from, size_t to, uint8_t* out, net::Deadline deadline)> gather;
};

struct StoreBridgeStats {
  uint64_t fetches = 0, fetched_blocks = 0, publishes = 0, published_blocks = 0;
  // Of the fetched blocks, where they came from: the local server's memory, its replicas,
  // its SSD, other nodes (the client's own counters also count the start-up probe).
  uint64_t fetched_from[4] = {};
  uint64_t waits = 0, waited_blocks = 0;  // single-flight: fetches that waited, blocks they got
  uint64_t publishes_failed = 0, publishes_dropped = 0;
  uint64_t claims_given_up = 0;  // GiveUps sent: requests that ended before publishing what they claimed
  uint64_t misses[kStoreMissKinds] = {};
  double get_bytes_per_second = 0;  // current estimate (0: none yet)
  double lookup_seconds = 0;        // current estimate of one lookup round trip
};

class StoreBridge : public PrefixStore {
 public:
  // Connects to the store. Unavailable if no server answers within connect_timeout; a
  // server that goes away later only makes misses.
  static Result<std::unique_ptr<StoreBridge>> Connect(const StoreBridgeOptions& options);
  ~StoreBridge() override;

  void StartFetch(StoreFetch f) override;
  void StartPublish(StorePublish p) override;
  void GiveUp(const StoreNamespace& ns, std::vector<int32_t> tokens) override;
  void Poll(std::vector<StoreFetchDone>* fetched, std::vector<StorePublishDone>* published,
            std::chrono::microseconds wait) override;
  void Drain() override;
  void AbandonQueued() override;
  size_t in_flight() const override;
  bool handles_layer_split() const override { return opt_.reader && opt_.gather; }

  StoreBridgeStats stats() const;
  store::StoreClient& client() { return *client_; }

  // The estimated time of reading `bytes` (a lookup plus the transfer); 0 when nothing
  // has been measured yet.
  double EstimateFetchSeconds(uint64_t bytes) const;

 private:
  StoreBridge() = default;
  void FetchLoop();
  void PublishLoop();
  StoreFetchDone RunFetch(const StoreFetch& f);
  void Complete(StoreFetchDone d);
  void Complete(StorePublishDone d);
  void MeasureGet(uint64_t bytes, double seconds);
  Result<size_t> PublishGathered(const StorePublish& p, net::Deadline deadline);

  StoreBridgeOptions opt_;
  std::unique_ptr<store::StoreClient> client_;
  // Publishes go on their own connections, with their own progress thread at nice 19: a
  // lookup must not wait behind the bulk transfer of a publish (the owner's read of the
  // staging buffer is served by the progress thread, in order with the lookup's reply), and the
  // transfer must not take the cores from the compute threads.
  std::unique_ptr<store::StoreClient> publish_client_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // new work or stop
  std::condition_variable done_cv_;  // a completion
  std::deque<StoreFetch> fetches_;          // GUARDED_BY(mu_)
  std::deque<StorePublish> publishes_;      // GUARDED_BY(mu_)
  std::vector<StoreFetchDone> fetch_done_;  // GUARDED_BY(mu_)
  std::vector<StorePublishDone> publish_done_;  // GUARDED_BY(mu_)
  size_t in_flight_ = 0;                    // started, not yet polled; GUARDED_BY(mu_)
  size_t running_ = 0;                      // being worked on now; GUARDED_BY(mu_)
  // Claims to drop (GiveUp), run on the publish thread before publishes; GUARDED_BY(mu_)
  std::deque<std::pair<StoreNamespace, std::vector<int32_t>>> unclaims_;
  bool stop_ = false;                       // GUARDED_BY(mu_)
  StoreBridgeStats st_;                     // GUARDED_BY(mu_)
  std::vector<std::thread> fetch_threads_;
  std::thread publish_thread_;
};

// The namespace an engine's blocks are stored under (docs/store.md, "Data model").
store::Namespace ToStoreNamespace(const StoreNamespace& ns);

}  // namespace trellis
