#include "engine/store_bridge.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "util/clock.h"
#include "util/log.h"

namespace trellis {

namespace {

StoreMiss MissOf(const Status& s) {
  switch (s.code()) {
    case StatusCode::kNotFound: return StoreMiss::kEvicted;
    case StatusCode::kCorrupt: return StoreMiss::kChecksum;
    case StatusCode::kDeadlineExceeded: return StoreMiss::kDeadline;
    case StatusCode::kFailedPrecondition: return StoreMiss::kFingerprint;
    case StatusCode::kUnavailable:
    case StatusCode::kCancelled: return StoreMiss::kDown;
    default: return StoreMiss::kError;  // refused as malformed, full, an I/O error: not the store being down
  }
}

// Running estimates move a quarter of the way to each new measurement.
double Smooth(double old, double x) { return old <= 0 ? x : 0.75 * old + 0.25 * x; }

// The probe that measures the get bandwidth at start: a few blocks under a namespace no
// model uses, the same on every node (stored once, read by each engine that starts).
constexpr uint32_t kProbeBlocks = 4;
constexpr uint32_t kProbeBlockTokens = 32;
constexpr uint64_t kProbeBlockBytes = 256 * 1024;
store::Namespace ProbeNamespace() {
  store::Namespace ns;
  ns.model_fingerprint = 0;
  ns.block_tokens = kProbeBlockTokens;
  ns.salt = 0x70726f6265ull;  // "probe"
  return ns;
}

}  // namespace

store::Namespace ToStoreNamespace(const StoreNamespace& n) {
  store::Namespace ns;
  ns.model_fingerprint = n.model_fingerprint;
  ns.block_tokens = n.block_tokens;
  ns.kv_dtype = n.kv_dtype;
  ns.layout_version = n.layout_version;
  ns.salt = n.salt;
  return ns;
}

Result<std::unique_ptr<StoreBridge>> StoreBridge::Connect(const StoreBridgeOptions& options) {
  std::unique_ptr<StoreBridge> b(new StoreBridge());
  b->opt_ = options;
  TRELLIS_ASSIGN_OR_RETURN(b->client_, store::StoreClient::Connect(options.client, net::After(options.connect_timeout)));
  // Measure the read path once before serving: store the probe (once per store), then
  // read it back a few times. A failure leaves the estimates empty (fetches are then
  // always tried, and measured).
  {
    std::vector<int32_t> tokens(kProbeBlocks * kProbeBlockTokens);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
    std::vector<uint8_t> data(kProbeBlocks * kProbeBlockBytes);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131u);
    std::vector<const void*> src;
    std::vector<void*> dst;
    for (uint32_t i = 0; i < kProbeBlocks; ++i) {
      src.push_back(data.data() + i * kProbeBlockBytes);
      dst.push_back(data.data() + i * kProbeBlockBytes);
    }
    const auto deadline = net::After(options.connect_timeout);
    auto put = b->client_->Put(ProbeNamespace(), tokens, src, kProbeBlockBytes, 0.0, deadline);
    for (int r = 0; put.ok() && r < 3; ++r) {
      const double t0 = NowSeconds();
      auto found = b->client_->Lookup(ProbeNamespace(), tokens, deadline);
      if (!found.ok() || found->blocks != kProbeBlocks) break;
      const double t1 = NowSeconds();
      if (!b->client_->Get(*found, kProbeBlocks, dst, kProbeBlockBytes, deadline).ok()) break;
      const double t2 = NowSeconds();
      std::lock_guard<std::mutex> lock(b->mu_);
      b->st_.lookup_seconds = Smooth(b->st_.lookup_seconds, t1 - t0);
      b->st_.get_bytes_per_second = Smooth(b->st_.get_bytes_per_second, kProbeBlocks * kProbeBlockBytes / std::max(t2 - t1, 1e-6));
    }
    if (!put.ok()) TRELLIS_LOG_WARN("store: bandwidth probe not stored: {}", put.status().ToString());
  }
  store::ClientOptions publish_options = options.client;
  publish_options.transport.nice = 19;  // publishing never delays a token: it gets what compute leaves
  TRELLIS_ASSIGN_OR_RETURN(b->publish_client_,
                           store::StoreClient::Connect(publish_options, net::After(options.connect_timeout)));
  for (int i = 0; i < std::max(1, options.fetch_threads); ++i) {
    b->fetch_threads_.emplace_back([p = b.get()] { p->FetchLoop(); });
  }
  b->publish_thread_ = std::thread([p = b.get()] { p->PublishLoop(); });
  return b;
}

StoreBridge::~StoreBridge() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : fetch_threads_) t.join();
  if (publish_thread_.joinable()) publish_thread_.join();
}

void StoreBridge::StartFetch(StoreFetch f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
    fetches_.push_back(std::move(f));
  }
  work_cv_.notify_all();
}

void StoreBridge::StartPublish(StorePublish p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
    if (publishes_.size() >= opt_.max_queued_publishes) {
      // The store cannot keep up: drop the oldest rather than grow without bound (its
      // blocks are only unpinned, nothing is lost but the chance to share them).
      StorePublishDone d;
      d.id = publishes_.front().id;
      d.status = ResourceExhausted("publish queue full");
      publishes_.pop_front();
      ++st_.publishes_dropped;
      publish_done_.push_back(std::move(d));
    }
    publishes_.push_back(std::move(p));
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
}

void StoreBridge::GiveUp(const StoreNamespace& ns, std::vector<int32_t> tokens) {
  if (!opt_.single_flight || tokens.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (unclaims_.size() >= opt_.max_queued_publishes) unclaims_.pop_front();  // those expire instead
    unclaims_.emplace_back(ns, std::move(tokens));
  }
  work_cv_.notify_all();
}

void StoreBridge::Poll(std::vector<StoreFetchDone>* fetched, std::vector<StorePublishDone>* published,
                       std::chrono::microseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (fetch_done_.empty() && publish_done_.empty() && wait.count() > 0 && in_flight_ > 0) {
    done_cv_.wait_for(lock, wait, [&] { return !fetch_done_.empty() || !publish_done_.empty(); });
  }
  in_flight_ -= fetch_done_.size() + publish_done_.size();
  for (auto& d : fetch_done_) fetched->push_back(std::move(d));
  for (auto& d : publish_done_) published->push_back(std::move(d));
  fetch_done_.clear();
  publish_done_.clear();
}

void StoreBridge::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return fetches_.empty() && publishes_.empty() && unclaims_.empty() && running_ == 0; });
}

void StoreBridge::AbandonQueued() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const StoreFetch& f : fetches_) {
      StoreFetchDone d;
      d.id = f.id;
      d.miss = StoreMiss::kDeadline;
      fetch_done_.push_back(d);
    }
    for (const StorePublish& p : publishes_) {
      StorePublishDone d;
      d.id = p.id;
      d.status = Cancelled("shutting down");
      publish_done_.push_back(std::move(d));
    }
    fetches_.clear();
    publishes_.clear();
  }
  done_cv_.notify_all();
}

size_t StoreBridge::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

StoreBridgeStats StoreBridge::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return st_;
}

double StoreBridge::EstimateFetchSeconds(uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (st_.get_bytes_per_second <= 0) return 0;
  return st_.lookup_seconds + static_cast<double>(bytes) / st_.get_bytes_per_second;
}

void StoreBridge::MeasureGet(uint64_t bytes, double seconds) {
  // Small reads measure latency more than bandwidth: only reads of 1 MiB and more count.
  if (bytes < (1u << 20) || seconds <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  st_.get_bytes_per_second = Smooth(st_.get_bytes_per_second, static_cast<double>(bytes) / seconds);
}

void StoreBridge::Complete(StoreFetchDone d) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++st_.fetches;
    st_.fetched_blocks += static_cast<uint64_t>(d.blocks);
    st_.fetched_from[0] += static_cast<uint64_t>(d.from_memory);
    st_.fetched_from[1] += static_cast<uint64_t>(d.from_replica);
    st_.fetched_from[2] += static_cast<uint64_t>(d.from_ssd);
    st_.fetched_from[3] += static_cast<uint64_t>(d.from_remote);
    st_.waits += d.waited > 0;
    st_.waited_blocks += static_cast<uint64_t>(d.waited);
    if (d.miss != StoreMiss::kNone) ++st_.misses[static_cast<int>(d.miss)];
    fetch_done_.push_back(std::move(d));
    --running_;
  }
  done_cv_.notify_all();
}

void StoreBridge::Complete(StorePublishDone d) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (d.status.ok()) {
      ++st_.publishes;
      st_.published_blocks += static_cast<uint64_t>(d.stored);
    } else {
      ++st_.publishes_failed;
    }
    publish_done_.push_back(std::move(d));
    --running_;
  }
  done_cv_.notify_all();
}

void StoreBridge::FetchLoop() {
  for (;;) {
    StoreFetch f;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !fetches_.empty(); });
      if (fetches_.empty()) return;
      f = std::move(fetches_.front());
      fetches_.pop_front();
      ++running_;
    }
    Complete(RunFetch(f));
  }
}

StoreFetchDone StoreBridge::RunFetch(const StoreFetch& f) {
  StoreFetchDone d;
  d.id = f.id;
  const double t0 = NowSeconds();
  const size_t want = f.dst.size();
  if (want == 0) return d;
  // The deadline: the configured bound, or sooner if computing the blocks would be.
  auto budget = opt_.fetch_timeout;
  if (f.compute_seconds_per_block > 0) {
    const auto compute =
        std::chrono::milliseconds(static_cast<int64_t>(f.compute_seconds_per_block * 1000.0 * static_cast<double>(want))) +
        opt_.compute_bound_slack;
    budget = std::min(budget, compute);
  }
  const net::Deadline deadline = net::Clock::now() + budget;
  const store::Namespace ns = ToStoreNamespace(f.ns);
  // Single-flight: claim what this engine is about to compute for as long as that should
  // take (twice the estimate, and at least 5 s; a minute when nothing is measured yet).
  uint32_t claim_ms = 0;
  if (opt_.single_flight) {
    const double est = f.compute_seconds_per_block * static_cast<double>(want);
    claim_ms = static_cast<uint32_t>(std::clamp(est > 0 ? 2000.0 * est + 5000.0 : 60000.0, 1.0, 600000.0));
  }
  auto found = client_->Lookup(ns, f.tokens, deadline, claim_ms);
  const double t1 = NowSeconds();
  if (!found.ok()) {
    d.miss = MissOf(found.status());
    d.seconds = t1 - t0;
    return d;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    st_.lookup_seconds = Smooth(st_.lookup_seconds, t1 - t0);
  }
  const size_t first = static_cast<size_t>(f.first_block);
  const size_t stored_at_lookup = found->blocks > first ? found->blocks - first : 0;
  // Reads blocks [fetched, upto) of the request into dst; fetched advances on success.
  size_t fetched = 0;
  store::GetReceipt r;
  Status read_status;
  double read_seconds = 0;
  const auto read_upto = [&](size_t upto, net::Deadline dl) {
    if (upto <= fetched || !read_status.ok()) return;
    std::vector<void*> dst(f.dst.begin() + static_cast<ptrdiff_t>(fetched), f.dst.begin() + static_cast<ptrdiff_t>(upto));
    const double t = NowSeconds();
    store::GetReceipt part;
    if (opt_.reader) {
      read_status = opt_.reader(*client_, *found, first + fetched, fetched, upto, f, dl, &part);
    } else {
      read_status = client_->GetRange(*found, first + fetched, upto - fetched, dst, f.block_bytes, dl, &part,
                                      store::ByteRange{f.local.offset, f.local.bytes});
    }
    if (!read_status.ok()) {
      TRELLIS_LOG_DEBUG("store: fetch of {} blocks failed: {}", upto - fetched, read_status.ToString());
      return;
    }
    read_seconds += NowSeconds() - t;
    fetched = upto;
    r.memory += part.memory, r.replica += part.replica, r.ssd += part.ssd, r.remote += part.remote;
  };
  const auto stored_now = [&] { return std::min(found->blocks > first ? found->blocks - first : 0, want); };
  StoreMiss wait_miss = StoreMiss::kNone;
  if (found->pending > 0 && stored_at_lookup < want) {
    // Another engine is computing the next blocks: wait for its Puts rather than compute
    // them a second time. It publishes as it goes (every prefill chunk), so what it has
    // stored is read while it computes the rest, and the bound is the compute still
    // left here: it moves each time more of the prefix is stored, never past the claim.
    // The estimate is this engine's mean prefill rate, which undercounts a chunk deep in
    // a long prompt (attention grows with position); so once the other engine has shown
    // its pace, the next chunk may also take up to twice its last one.
    const size_t target = std::min<size_t>(found->blocks + found->pending, first + want);
    const auto claim_end = net::Clock::now() + std::chrono::milliseconds(found->pending_ms + 200);
    auto last_progress = net::Clock::now();
    net::Clock::duration last_interval{0};
    const auto bound_from = [&](size_t stored_blocks) {
      const double own = f.compute_seconds_per_block * static_cast<double>(target - std::max<size_t>(stored_blocks, first));
      if (own <= 0) return claim_end;
      const auto own_d = std::chrono::duration_cast<net::Clock::duration>(std::chrono::duration<double>(own));
      return std::min(claim_end, net::Clock::now() + std::max(own_d, 2 * last_interval));
    };
    auto bound = bound_from(found->blocks);
    auto poll = std::chrono::milliseconds(2);
    bool got = false;
    while (read_status.ok() && net::Clock::now() < bound) {
      read_upto(stored_now(), net::Clock::now() + budget);
      std::this_thread::sleep_for(poll);
      poll = std::min(poll * 2, std::chrono::milliseconds(20));
      auto again = client_->Lookup(ns, f.tokens, std::min(bound, net::After(std::chrono::milliseconds(500))));
      if (!again.ok()) break;
      if (again->blocks > found->blocks) {
        found = std::move(again);
        const auto now = net::Clock::now();
        last_interval = now - last_progress;
        last_progress = now;
        bound = bound_from(found->blocks);
      }
      if (found->blocks >= target) {
        got = true;
        break;
      }
    }
    if (!got) wait_miss = StoreMiss::kPendingTimeout;
  } else {
    // Nothing to wait for: read only if that is estimated quicker than computing.
    const size_t n = stored_now();
    const double est = EstimateFetchSeconds(n * f.block_bytes);
    if (n > 0 && f.compute_seconds_per_block > 0 && est > 0 && est > f.compute_seconds_per_block * static_cast<double>(n)) {
      d.miss = StoreMiss::kSlower;
      d.seconds = NowSeconds() - t0;
      return d;
    }
  }
  read_upto(stored_now(), net::Clock::now() + budget);
  d.seconds = NowSeconds() - t0;
  if (fetched == 0) {
    d.miss = !read_status.ok() ? MissOf(read_status)
             : wait_miss != StoreMiss::kNone ? wait_miss
                                             : StoreMiss::kNotStored;
    return d;
  }
  MeasureGet(fetched * f.block_bytes, read_seconds);
  d.blocks = static_cast<int32_t>(fetched);
  d.from_memory = static_cast<int32_t>(r.memory);
  d.from_replica = static_cast<int32_t>(r.replica);
  d.from_ssd = static_cast<int32_t>(r.ssd);
  d.from_remote = static_cast<int32_t>(r.remote);
  d.waited = static_cast<int32_t>(fetched > stored_at_lookup ? fetched - stored_at_lookup : 0);
  if (fetched < want) {
    d.miss = !read_status.ok() ? MissOf(read_status)
             : wait_miss != StoreMiss::kNone ? wait_miss
                                             : StoreMiss::kNotStored;
  }
  return d;
}

void StoreBridge::PublishLoop() {
  // The staging copy runs here: at nice 19, like the publish transport (best effort).
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
  for (;;) {
    StorePublish p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !publishes_.empty() || !unclaims_.empty(); });
      if (stop_) unclaims_.clear();  // shutting down: those claims expire
      if (!unclaims_.empty()) {
        auto [ns, tokens] = std::move(unclaims_.front());
        unclaims_.pop_front();
        ++running_;
        lock.unlock();
        (void)client_->Unclaim(ToStoreNamespace(ns), tokens, net::After(std::chrono::milliseconds(1000)));
        lock.lock();
        ++st_.claims_given_up;
        --running_;
        lock.unlock();
        done_cv_.notify_all();
        continue;
      }
      if (publishes_.empty()) return;
      p = std::move(publishes_.front());
      publishes_.pop_front();
      ++running_;
    }
    StorePublishDone d;
    d.id = p.id;
    const auto deadline = net::After(opt_.publish_timeout);
    Result<size_t> put = size_t{0};
    if (opt_.gather) {
      put = PublishGathered(p, deadline);
    } else {
      std::vector<const void*> blocks(p.blocks.begin(), p.blocks.end());
      put = publish_client_->Put(ToStoreNamespace(p.ns), p.tokens, blocks, p.block_bytes, p.cost_seconds, deadline,
                                 p.slices);
    }
    if (put.ok()) {
      d.stored = static_cast<int32_t>(*put);
    } else {
      d.status = put.status();
      TRELLIS_LOG_DEBUG("store: publish of {} blocks failed: {}", p.blocks.size(), d.status.ToString());
      // The fetch that admitted this prompt claimed the blocks this engine computed (the
      // fetch client's claims): nobody will put them now, so let others compute them
      // rather than wait for the claims to expire (best effort).
      if (opt_.single_flight) (void)client_->Unclaim(ToStoreNamespace(p.ns), p.tokens, net::After(std::chrono::milliseconds(1000)));
    }
    Complete(std::move(d));
  }
}

// A grid head's publish: the increment past what is stored, gathered whole from every
// process (the head's layers here, the nodes' from them), then put as one tensor. A block
// the store lost between the lookup and the put is not in the gathered buffer: the put
// then fails rather than store what was not gathered.
Result<size_t> StoreBridge::PublishGathered(const StorePublish& p, net::Deadline deadline) {
  const store::Namespace ns = ToStoreNamespace(p.ns);
  TRELLIS_ASSIGN_OR_RETURN(store::LookupResult found, publish_client_->Lookup(ns, p.tokens, deadline));
  const size_t n = std::min(found.keys.size(), p.blocks.size());
  const size_t k = std::min(found.blocks, n);
  if (k == n) return size_t{0};
  // Freed after each publish (large: a long prompt's increment of whole blocks).
  std::vector<uint8_t> buf((n - k) * p.block_bytes);
  TRELLIS_RETURN_IF_ERROR(opt_.gather(p, k, n, buf.data(), deadline));
  std::vector<const void*> blocks(n, nullptr);
  for (size_t i = k; i < n; ++i) blocks[i] = buf.data() + (i - k) * p.block_bytes;
  return publish_client_->Put(ns, p.tokens, blocks, p.block_bytes, p.cost_seconds, deadline, p.slices);
}

}  // namespace trellis
