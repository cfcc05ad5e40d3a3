#include "grid/node.h"

#include <condition_variable>
#include <new>
#include <cstring>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include <fmt/core.h>

#include "engine/kv_layout.h"
#include "engine/forward.h"
#include "grid/protocol.h"
#include "kv/block_pool.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/meminfo.h"
#include "util/thread_pool.h"

namespace trellis::grid {

struct GridNode::Impl {
  const Model& model;
  NodeOptions opt;
  std::unique_ptr<net::Transport> t;
  uint16_t port = 0;
  ThreadPool threads;

  struct Job {
    uint16_t type = 0;
    net::ConnId conn = 0;
    uint64_t request_id = 0;
    uint64_t seq = 0;  // steps: from the body, for ordering
    std::string peer;  // hellos: who sent it, for the log
    std::string body;
  };
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> jobs;  // GUARDED_BY(mu)
  bool stopping = false;  // GUARDED_BY(mu)
  NodeStats stats;        // GUARDED_BY(mu)
  std::thread compute;
  // The store's jobs (Fetch, Read), on their own threads: a fetch waits on the network.
  std::unique_ptr<store::StoreClient> store;
  std::deque<Job> store_jobs;  // GUARDED_BY(mu)
  std::condition_variable store_cv;
  std::vector<std::thread> store_threads;
  std::function<void(std::string_view)> fault_hook;  // tests only (SetFaultHookForTesting)
  // Held shared while a store job touches the pool, exclusively by a Hello (which may
  // replace the pool, and after which nothing of the previous head may land in it).
  // Taken before mu.
  std::shared_mutex pool_mu;

  // Compute thread only (have_geometry is also read under mu by NextJob).
  HelloRequest geometry;
  bool have_geometry = false;
  net::ConnId head_conn = 0;  // the connection the accepted Hello came on
  uint64_t next_seq = 1;
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<Forward> forward;
  std::vector<int32_t> zeros;     // token values a stage that does not embed ignores
  std::vector<SeqBatch> batch;
  std::vector<float> hidden_in;   // the message's hidden state, when it is not float-aligned

  Impl(const Model& m, const NodeOptions& o) : model(m), opt(o), threads(std::max(1, o.threads)) {}
  // The loop's callbacks reach this object: stop it before any member goes (Start's
  // error paths; ~GridNode stops it first anyway).
  ~Impl() {
    if (t) t->Stop();
  }

  // The largest KV pool this node builds for a head.
  uint64_t KvLimit() const {
    if (opt.max_kv_bytes > 0) return opt.max_kv_bytes;
    // 90% of what the system has available now (its weights are resident already).
    const int64_t avail = MemAvailableBytes();
    return avail > 0 ? static_cast<uint64_t>(avail) / 10 * 9 : uint64_t{1} << 30;
  }

  void Reply(net::ConnId c, uint64_t rid, std::string body) {
    t->Post([this, c, rid, b = std::move(body)]() mutable { t->Reply(c, rid, std::move(b)); });
  }
  void ReplyError(net::ConnId c, uint64_t rid, Status st) {
    t->Post([this, c, rid, st = std::move(st)] { t->ReplyError(c, rid, st); });
  }

  // Loop thread: queue the request for the compute thread (the body is valid only now).
  void OnRequest(net::ConnId c, uint16_t type, uint64_t rid, std::string_view body) {
    if (type == kPing) {
      if (body.size() > (size_t{1} << 20)) {
        t->ReplyError(c, rid, InvalidArgument("ping body over 1 MiB"));
      } else {
        t->Reply(c, rid, std::string(body));
      }
      return;
    }
    if (type == kFetch || type == kRead) {
      Job j;
      j.type = type;
      j.conn = c;
      j.request_id = rid;
      j.body.assign(body);
      {
        std::lock_guard<std::mutex> lock(mu);
        store_jobs.push_back(std::move(j));
      }
      store_cv.notify_one();
      return;
    }
    if (type != kHello && type != kStep) {
      t->ReplyError(c, rid, InvalidArgument(fmt::format("message type {} is not a grid request", type)));
      return;
    }
    Job j;
    j.type = type;
    j.conn = c;
    j.request_id = rid;
    if (type == kStep && body.size() >= 16) {
      for (int i = 0; i < 8; ++i) j.seq |= static_cast<uint64_t>(static_cast<uint8_t>(body[8 + i])) << (8 * i);
    }
    if (type == kHello) j.peer = t->PeerName(c);
    j.body.assign(body);
    {
      std::lock_guard<std::mutex> lock(mu);
      jobs.push_back(std::move(j));
    }
    cv.notify_one();
  }

  // Compute thread: the next job to run, or false when stopping. A Hello runs at once; a
  // step waits for its turn (steps may arrive out of order).
  bool NextJob(Job& out) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (stopping) return false;
      for (auto it = jobs.begin(); it != jobs.end(); ++it) {
        // Runs now: a Hello, the next step, and anything to refuse at once (malformed, of
        // another head or connection, or a number already taken).
        if (it->type == kHello || it->seq == next_seq || it->body.size() < 16 || !have_geometry ||
            HeadOf(it->body) != geometry.head_id || it->conn != head_conn || it->seq < next_seq) {
          out = std::move(*it);
          jobs.erase(it);
          return true;
        }
      }
      cv.wait(lock);
    }
  }
  static uint64_t HeadOf(const std::string& body) {
    uint64_t h = 0;
    for (int i = 0; i < 8; ++i) h |= static_cast<uint64_t>(static_cast<uint8_t>(body[static_cast<size_t>(i)])) << (8 * i);
    return h;
  }

  void RunHello(const Job& j) {
    std::unique_lock<std::shared_mutex> pool_lock(pool_mu);  // no fetch or read of the last head runs on
    HelloRequest h;
    Status st = DecodeHello(j.body, h);
    if (st.ok() && h.store && !store) {
      st = InvalidArgument("refused: the head reads prefixes from a store, and this node has none: start it with --store");
    }
    const ModelPart& part = model.part();
    if (st.ok() && (h.fingerprint != model.fingerprint() || h.n_layer != static_cast<uint32_t>(model.config().n_layer))) {
      st = InvalidArgument(fmt::format(
          "refused: this node holds model {:016x} ({} layers), the head runs model {:016x} ({} layers); start the node "
          "with the head's model file",
          model.fingerprint(), model.config().n_layer, h.fingerprint, h.n_layer));
    }
    if (st.ok() && (h.first_layer != static_cast<uint32_t>(part.first_layer) ||
                    h.last_layer != static_cast<uint32_t>(part.last_layer))) {
      st = InvalidArgument(fmt::format("refused: this node holds layers {}-{}, the head expects layers {}-{} here",
                                       part.first_layer, part.last_layer - 1, h.first_layer, h.last_layer - 1));
    }
    if (st.ok() && (h.block_size * static_cast<uint32_t>(model.config().head_dim)) % 32 != 0) {
      st = InvalidArgument(fmt::format("refused: block size {} does not suit head_dim {}", h.block_size, model.config().head_dim));
    }
    KvType kt = KvType::kF16, vt = KvType::kF16;
    KvTypesFromCode(h.kv_types, &kt, &vt);  // checked by DecodeHello
    if (st.ok() && opt.kv_types >= 0 && h.kv_types != static_cast<uint32_t>(opt.kv_types)) {
      KvType nk = KvType::kF16, nv = KvType::kF16;
      KvTypesFromCode(static_cast<uint32_t>(opt.kv_types), &nk, &nv);
      st = InvalidArgument(fmt::format("refused: the head keeps K/V as {}/{}, this node was started with -ctk {} -ctv {}",
                                       KvTypeName(kt), KvTypeName(vt), KvTypeName(nk), KvTypeName(nv)));
    }
    if (st.ok()) st = CheckKvTypes(model.config(), kt, vt);
    const KvLayout layout = LocalKvLayoutFor(model, static_cast<int>(h.block_size), kt, vt);
    const uint64_t pool_bytes = static_cast<uint64_t>(h.n_blocks) * layout.BlockBytes();
    if (st.ok() && h.max_batch_tokens > opt.max_batch_tokens) {
      st = ResourceExhausted(fmt::format("refused: steps of {} tokens asked, this node takes at most {}",
                                         h.max_batch_tokens, opt.max_batch_tokens));
    }
    if (st.ok() && pool_bytes > KvLimit()) {
      st = ResourceExhausted(fmt::format("refused: a KV pool of {:.1f} MiB asked, this node allows {:.1f} MiB (--max-kv-memory)",
                                         pool_bytes / 1048576.0, KvLimit() / 1048576.0));
    }
    if (st.ok()) {
      // The pool: the head's ids, this node's layers of each block. Kept when the geometry
      // is the same (its contents are forgotten all the same: the head starts over). A new
      // one is built aside and swapped in only when all of it exists, so a refused Hello
      // leaves the node as it was.
      const bool same = pool && have_geometry && geometry.block_size == h.block_size && geometry.n_blocks == h.n_blocks &&
                        geometry.max_batch_tokens == h.max_batch_tokens && geometry.kv_types == h.kv_types;
      if (!same) {
        forward.reset();  // it borrows the old pool's memory
        try {
          auto p = BlockPool::Create(layout, static_cast<int32_t>(h.n_blocks));
          if (!p.ok()) {
            st = p.status().WithContext("refused: this node cannot hold the head's KV pool");
          } else {
            auto f = std::make_unique<Forward>(model, (*p)->view(), static_cast<int>(h.max_batch_tokens), 1, threads);
            std::vector<int32_t> z(h.max_batch_tokens, 0);
            pool = std::move(p).value();
            forward = std::move(f);
            zeros = std::move(z);
          }
        } catch (const std::bad_alloc&) {
          st = ResourceExhausted("refused: this node ran out of memory building the head's KV pool and buffers");
        }
        if (!st.ok()) {
          // The old pool may be gone (forward was): serve no head until a Hello succeeds.
          pool.reset();
          forward.reset();
          std::lock_guard<std::mutex> lock(mu);
          have_geometry = false;
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!st.ok()) {
      ++stats.refused_hellos;
      TRELLIS_LOG_WARN("grid node: hello from {}: {}", j.peer, st.message());
      ReplyError(j.conn, j.request_id, st);
      return;
    }
    geometry = h;
    have_geometry = true;
    head_conn = j.conn;
    next_seq = 1;
    // Every step queued now was sent before this Hello (the head sends none until it has
    // the reply): of an earlier head, or of this one on a connection it gave up. Stale.
    std::erase_if(jobs, [&](const Job& q) { return q.type == kStep; });
    ++stats.hellos;
    stats.kv_pool_bytes = static_cast<uint64_t>(pool->n_blocks()) * pool->block_bytes();
    HelloReply r;
    r.fingerprint = model.fingerprint();
    r.first_layer = static_cast<uint32_t>(part.first_layer);
    r.last_layer = static_cast<uint32_t>(part.last_layer);
    r.threads = static_cast<uint32_t>(threads.size());
    r.weight_bytes = static_cast<uint64_t>(model.WeightBytes());
    r.kv_pool_bytes = stats.kv_pool_bytes;
    TRELLIS_LOG_INFO("grid node: head {:016x} connected: {} blocks of {} tokens, K/V {}/{}, {} MiB of KV for layers {}-{}",
                     h.head_id, h.n_blocks, h.block_size, KvTypeName(kt), KvTypeName(vt), stats.kv_pool_bytes >> 20,
                     part.first_layer, part.last_layer - 1);
    Reply(j.conn, j.request_id, EncodeHelloReply(r));
  }

  void RunStep(const Job& j) {
    StepRequest s;
    Status st = have_geometry ? DecodeStep(j.body, geometry, static_cast<uint32_t>(model.config().n_embd), s)
                              : Unavailable("this node has no head: send hello first");
    if (st.ok() && (s.head_id != geometry.head_id || j.conn != head_conn)) {
      st = Unavailable("refused: a step from a head, or a connection, this node does not serve");
    }
    if (st.ok() && s.seq != next_seq) {
      st = InvalidArgument(fmt::format("step {} out of order (expected {})", s.seq, next_seq));
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.refused_steps;
      ReplyError(j.conn, j.request_id, st);
      return;
    }
    ++next_seq;
    const double t0 = NowSeconds();
    for (const auto& c : s.copies) pool->CopySlots(c[0], c[1], c[2]);
    batch.clear();
    size_t row = 0;
    for (const StepSeq& q : s.seqs) {
      batch.push_back(SeqBatch{std::span<const int32_t>(zeros.data(), static_cast<size_t>(q.n_tokens)), q.pos0, q.table, 0});
      row += static_cast<size_t>(q.n_tokens);
    }
    // The hidden state sits at a 4-byte offset of a heap buffer, so it is read in place;
    // copied first only if it ever is not float-aligned.
    const float* in = reinterpret_cast<const float*>(s.hidden.data());
    if (reinterpret_cast<uintptr_t>(in) % alignof(float) != 0) {
      hidden_in.resize(s.hidden.size() / sizeof(float));
      std::memcpy(hidden_in.data(), s.hidden.data(), s.hidden.size());
      in = hidden_in.data();
    }
    st = forward->Prepare(batch, in);
    if (!st.ok()) {
      ReplyError(j.conn, j.request_id, st);
      return;
    }
    forward->RunLayers();
    std::string out(reinterpret_cast<const char*>(forward->hidden()), s.hidden.size());
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.steps;
      stats.tokens += row;
      stats.compute_seconds += NowSeconds() - t0;
    }
    Reply(j.conn, j.request_id, std::move(out));
  }

  // A store thread: the next Fetch or Read, or false when stopping.
  bool NextStoreJob(Job& out) {
    std::unique_lock<std::mutex> lock(mu);
    store_cv.wait(lock, [&] { return stopping || !store_jobs.empty(); });
    if (stopping) return false;
    out = std::move(store_jobs.front());
    store_jobs.pop_front();
    return true;
  }

  void RunStoreJob(const Job& j) {
    std::shared_lock<std::shared_mutex> pool_lock(pool_mu);
    HelloRequest g;
    bool serving = false;
    std::function<void(std::string_view)> hook;
    {
      std::lock_guard<std::mutex> lock(mu);
      serving = have_geometry && j.conn == head_conn;
      g = geometry;
      hook = fault_hook;
    }
    const ModelPart& part = model.part();
    // This node's layers of a block (the geometry is the accepted Hello's, when serving).
    KvType kt = KvType::kF16, vt = KvType::kF16;
    KvTypesFromCode(g.kv_types, &kt, &vt);
    const uint64_t local_bytes = serving ? LocalKvLayoutFor(model, static_cast<int>(g.block_size), kt, vt).BlockBytes() : 0;
    const uint64_t layer_bytes = local_bytes / static_cast<uint64_t>(model.n_local_layers());
    if (j.type == kRead) {
      ReadRequest r;
      Status st = serving ? DecodeRead(j.body, g.n_blocks, r) : Unavailable("this node serves no head on this connection");
      if (st.ok() && r.head_id != g.head_id) st = Unavailable("a read from a head this node does not serve");
      if (st.ok() && r.ids.size() * local_bytes + 1024 > opt.transport.max_message_bytes) {
        st = InvalidArgument(fmt::format("a read of {} blocks exceeds the transport's messages", r.ids.size()));
      }
      if (!st.ok()) return ReplyError(j.conn, j.request_id, st);
      std::string out(r.ids.size() * local_bytes, '\0');
      for (size_t i = 0; i < r.ids.size(); ++i) std::memcpy(out.data() + i * local_bytes, pool->BlockData(r.ids[i]), local_bytes);
      {
        std::lock_guard<std::mutex> lock(mu);
        stats.read_blocks += r.ids.size();
      }
      if (hook) hook("read");
      return Reply(j.conn, j.request_id, std::move(out));
    }
    // A Fetch is always answered with a FetchReply once nothing more will land in the
    // pool: an error reply would mean, to the head, that it might still be running.
    FetchRequest f;
    FetchReply rep;
    Status st = serving ? DecodeFetch(j.body, g.n_blocks, f) : Unavailable("this node serves no head on this connection");
    if (st.ok() && f.head_id != g.head_id) st = Unavailable("a fetch from a head this node does not serve");
    if (st.ok() && !store) st = Unavailable("this node has no store");
    if (st.ok() && (f.slices != static_cast<uint32_t>(model.config().n_layer) || f.block_bytes / f.slices != layer_bytes)) {
      st = InvalidArgument(fmt::format("a fetch of {}-byte blocks in {} slices; this node's layers are {} bytes of {}",
                                       f.block_bytes, f.slices, layer_bytes, model.config().n_layer));
    }
    if (st.ok()) {
      store::LookupResult found;
      found.blocks = f.found_blocks;
      found.runs = f.runs;
      std::vector<void*> dst;
      for (int32_t id : f.ids) dst.push_back(pool->BlockData(id));
      store::GetReceipt got;
      st = store->GetRange(found, f.first, f.ids.size(), dst, f.block_bytes, net::After(std::chrono::milliseconds(f.deadline_ms)),
                           &got, store::ByteRange{layer_bytes * static_cast<uint64_t>(part.first_layer), local_bytes});
      rep.memory = static_cast<uint32_t>(got.memory);
      rep.replica = static_cast<uint32_t>(got.replica);
      rep.ssd = static_cast<uint32_t>(got.ssd);
      rep.remote = static_cast<uint32_t>(got.remote);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.fetches;
      if (st.ok()) {
        stats.fetched_blocks += f.ids.size();
      } else {
        ++stats.fetch_failures;
      }
    }
    rep.status = st;
    Reply(j.conn, j.request_id, EncodeFetchReply(rep));
  }

  void StoreLoop() {
    Job j;
    while (NextStoreJob(j)) RunStoreJob(j);
  }

  void ComputeLoop() {
    Job j;
    while (NextJob(j)) {
      if (j.type == kHello) {
        RunHello(j);
      } else {
        RunStep(j);
      }
    }
  }
};

GridNode::GridNode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GridNode::~GridNode() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->store_cv.notify_all();
  if (impl_->compute.joinable()) impl_->compute.join();
  for (std::thread& t : impl_->store_threads) t.join();
  impl_->t->Stop();
}

Result<std::unique_ptr<GridNode>> GridNode::Start(const Model& model, const NodeOptions& options) {
  if (model.n_local_layers() < 1) return InvalidArgument("a grid node needs at least one layer");
  auto impl = std::make_unique<Impl>(model, options);
  if (!options.store.servers.empty() || !options.store.etcd.empty()) {
    auto c = store::StoreClient::Connect(options.store, net::After(options.store_connect_timeout));
    if (!c.ok()) return c.status().WithContext("the node's prefix store");
    impl->store = std::move(c).value();
  }
  net::TransportOptions to = options.transport;
  TRELLIS_ASSIGN_OR_RETURN(impl->t, net::Transport::Create(to));
  Impl* raw = impl.get();
  auto port = raw->t->Sync([&]() -> Result<uint16_t> {
    raw->t->SetRequestHandler([raw](net::ConnId c, uint16_t type, uint64_t rid, std::string_view body) {
      raw->OnRequest(c, type, rid, body);
    });
    return raw->t->Listen(raw->opt.host, raw->opt.port);
  });
  if (!port.ok()) return port.status();
  raw->port = *port;
  raw->compute = std::thread([raw] { raw->ComputeLoop(); });
  for (int i = 0; i < 2; ++i) raw->store_threads.emplace_back([raw] { raw->StoreLoop(); });
  return std::unique_ptr<GridNode>(new GridNode(std::move(impl)));
}

uint16_t GridNode::port() const { return impl_->port; }

void GridNode::SetFaultHookForTesting(std::function<void(std::string_view)> hook) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->fault_hook = hook;
  }
  if (impl_->store) {
    impl_->store->SetLandedHookForTesting(hook ? std::function<void(void*, uint64_t)>([hook](void*, uint64_t) { hook("fetch-landed"); })
                                               : nullptr);
  }
}

NodeStats GridNode::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace trellis::grid
