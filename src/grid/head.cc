#include "grid/head.h"

#include "grid/prefix_store.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <algorithm>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/core.h>

#include "engine/forward.h"
#include "grid/protocol.h"
#include "util/log.h"

namespace trellis::grid {

std::string NodeAddress::Name() const {
  if (last_layer - first_layer == 1) return fmt::format("{}:{} (layer {})", host, port, first_layer);
  return fmt::format("{}:{} (layers {}-{})", host, port, first_layer, last_layer - 1);
}

Result<std::vector<NodeAddress>> ParseGridSpec(const std::string& spec) {
  std::vector<NodeAddress> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const size_t colon = item.rfind(':', eq);
    const size_t dash = eq == std::string::npos ? std::string::npos : item.find('-', eq);
    auto bad = [&] { return InvalidArgument(fmt::format("--grid: '{}' is not HOST:PORT=FIRST-LAST", item)); };
    if (eq == std::string::npos || colon == std::string::npos || dash == std::string::npos || colon == 0) return bad();
    auto number = [](const std::string& s, long max, long& v) {
      if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return false;
      v = std::stol(s);
      return v <= max;
    };
    long port = 0, a = 0, b = 0;
    if (!number(item.substr(colon + 1, eq - colon - 1), 65535, port) || port == 0 ||
        !number(item.substr(eq + 1, dash - eq - 1), 1 << 20, a) || !number(item.substr(dash + 1), 1 << 20, b) || b < a) {
      return bad();
    }
    NodeAddress n;
    n.host = item.substr(0, colon);
    n.port = static_cast<uint16_t>(port);
    n.first_layer = static_cast<int>(a);
    n.last_layer = static_cast<int>(b) + 1;
    out.push_back(std::move(n));
    if (comma == spec.size()) break;
  }
  if (out.empty()) return InvalidArgument("--grid names no node");
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].first_layer != out[i - 1].last_layer) {
      return InvalidArgument(fmt::format("--grid: node {} starts at layer {}, but the node before it ends at layer {}: "
                                         "list the nodes in layer order, each starting where the previous one ends",
                                         out[i].Name(), out[i].first_layer, out[i - 1].last_layer - 1));
    }
  }
  return out;
}

namespace {

struct Flight {
  std::string prefix;          // the step after head id and seq, before the hidden state
  std::vector<uint64_t> seq;   // per node
  std::vector<uint64_t> gen;   // per node: the connection (Hello) seq was numbered for
  uint64_t epoch = 0;
  size_t copies = 0;           // slot copies the step carries
  std::vector<int32_t> n_tokens, n_logits;
  std::string hidden;          // the next node's input; at the end, the last node's output
  bool done = false;           // GUARDED_BY(Impl::mu)
  Status status;               // GUARDED_BY(Impl::mu)
};

}  // namespace

struct GridHead::Impl {
  const Model& model;
  HeadOptions opt;
  Forward fwd;
  std::unique_ptr<net::Transport> t;
  uint64_t head_id = 0;
  HelloRequest hello;  // geometry; layer range per node

  struct Node {
    NodeAddress addr;
    net::ConnId conn = 0;  // loop thread
    bool up = false;        // GUARDED_BY(mu)
    uint64_t next_seq = 0;  // GUARDED_BY(mu): the last sequence number given out
    uint64_t gen = 0;       // GUARDED_BY(mu): which Hello the numbering belongs to
    uint64_t steps = 0, failures = 0;  // GUARDED_BY(mu): HeadStats::Node
    double step_seconds = 0;           // GUARDED_BY(mu)
  };
  std::vector<Node> nodes;

  mutable std::mutex mu;
  std::condition_variable cv;
  bool healthy = false;     // GUARDED_BY(mu)
  std::string down;         // GUARDED_BY(mu)
  std::atomic<uint64_t> epoch{0};
  HeadStats stats;          // GUARDED_BY(mu)

  // Engine thread.
  std::deque<std::shared_ptr<Flight>> flights;
  std::vector<std::array<int32_t, 3>> copies;
  std::vector<StepSeq> step_seqs;
  std::vector<float> out_hidden;
  mutable uint64_t seen_epoch = 0;  // what the scheduler last read from epoch()

  Impl(const Model& m, const PagedKv& kv, int max_tokens, int max_logits, ThreadPool& threads, const HeadOptions& o)
      : model(m), opt(o), fwd(m, kv, max_tokens, max_logits, threads) {}
  // The loop's callbacks (timers, calls, the disconnect handler) reach this object: stop
  // the loop before any member goes (Create's error paths; ~GridHead stops it first).
  ~Impl() {
    if (t) t->Stop();
  }

  HelloRequest HelloFor(size_t i) const {
    HelloRequest h = hello;
    h.first_layer = static_cast<uint32_t>(nodes[i].addr.first_layer);
    h.last_layer = static_cast<uint32_t>(nodes[i].addr.last_layer);
    return h;
  }

  // A node's hello reply must describe what the head expects (the node checks as well).
  Status CheckReply(size_t i, const std::string& body) const {
    HelloReply r;
    TRELLIS_RETURN_IF_ERROR(DecodeHelloReply(body, r));
    if (r.fingerprint != model.fingerprint() || static_cast<int>(r.first_layer) != nodes[i].addr.first_layer ||
        static_cast<int>(r.last_layer) != nodes[i].addr.last_layer) {
      return InvalidArgument(fmt::format("node holds layers {}-{} of model {:016x}; expected layers {}-{} of {:016x}",
                                         r.first_layer, static_cast<int>(r.last_layer) - 1, r.fingerprint,
                                         nodes[i].addr.first_layer, nodes[i].addr.last_layer - 1, model.fingerprint()));
    }
    return Status::Ok();
  }

  // Loop thread: connect to node i and say hello; done(status) on the loop thread.
  void Hello(size_t i, std::function<void(Status)> done) {
    auto c = t->Connect(nodes[i].addr.host, nodes[i].addr.port);
    if (!c.ok()) {
      done(c.status());
      return;
    }
    const net::ConnId conn = *c;
    t->Call(conn, kHello, EncodeHello(HelloFor(i)), net::After(std::chrono::milliseconds(10000)),
            [this, i, conn, done = std::move(done)](Result<std::string> r) {
              Status st = r.ok() ? CheckReply(i, *r) : r.status();
              if (!st.ok()) {
                t->Close(conn);
                done(st);
                return;
              }
              nodes[i].conn = conn;
              {
                std::lock_guard<std::mutex> lock(mu);
                nodes[i].up = true;
                nodes[i].next_seq = 0;
                ++nodes[i].gen;
              }
              done(Status::Ok());
            });
  }

  // Loop thread.
  void NodeFailed(size_t i, net::ConnId conn, const Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!nodes[i].up || nodes[i].conn != conn) return;  // already handled
      nodes[i].up = false;
      healthy = false;
      down = fmt::format("grid node {} failed: {}", nodes[i].addr.Name(), why.message());
      ++stats.node_failures;
      ++nodes[i].failures;
    }
    TRELLIS_LOG_ERROR("grid head: node {} failed ({}); in-flight requests fail, reconnecting every {} ms",
                      nodes[i].addr.Name(), why.ToString(), opt.retry_interval.count());
    t->Close(conn);
    nodes[i].conn = 0;
    ScheduleReconnect(i);
  }

  void ScheduleReconnect(size_t i) {
    t->AddTimer(net::After(opt.retry_interval), [this, i] {
      Hello(i, [this, i](Status st) {
        if (!st.ok()) {
          if (st.code() != StatusCode::kUnavailable && st.code() != StatusCode::kDeadlineExceeded) {
            std::lock_guard<std::mutex> lock(mu);
            down = fmt::format("grid node {} refused the head: {}", nodes[i].addr.Name(), st.message());
          }
          ScheduleReconnect(i);
          return;
        }
        bool all = true;
        {
          std::lock_guard<std::mutex> lock(mu);
          for (const Node& n : nodes) all &= n.up;
          if (all) {
            // The node starts with an empty pool: what the scheduler cached is gone there.
            epoch.fetch_add(1);
            healthy = true;
            down.clear();
          }
          ++stats.rejoins;
        }
        TRELLIS_LOG_INFO("grid head: node {} rejoined{}", nodes[i].addr.Name(), all ? "; the grid serves again" : "");
      });
    });
  }

  void Finish(const std::shared_ptr<Flight>& f, Status st) {
    {
      std::lock_guard<std::mutex> lock(mu);
      f->status = std::move(st);
      f->done = true;
    }
    cv.notify_all();
  }

  // Loop thread: hands the flight to node i.
  void Send(const std::shared_ptr<Flight>& f, size_t i) {
    std::string body;
    net::ConnId conn = nodes[i].conn;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (f->epoch != epoch.load() || f->gen[i] != nodes[i].gen) {
        body = fmt::format("grid node {} reconnected while this batch was in flight", nodes[i].addr.Name());
      } else if (!nodes[i].up) {
        body = down.empty() ? fmt::format("grid node {} is down", nodes[i].addr.Name()) : down;
      }
    }
    if (!body.empty()) {
      Finish(f, Unavailable(body));
      return;
    }
    body = EncodeStepHeader(head_id, f->seq[i]);
    body += f->prefix;
    body += f->hidden;
    {
      std::lock_guard<std::mutex> lock(mu);
      stats.bytes_sent += body.size();
    }
    const auto sent = std::chrono::steady_clock::now();
    t->Call(conn, kStep, std::move(body), net::After(opt.step_timeout), [this, f, i, conn, sent](Result<std::string> r) {
      if (r.ok() && r->size() != f->hidden.size()) {
        r = Corrupt(fmt::format("answered {} bytes for a hidden state of {}", r->size(), f->hidden.size()));
      }
      if (!r.ok()) {
        NodeFailed(i, conn, r.status());
        Finish(f, Unavailable(fmt::format("grid node {} failed: {}", nodes[i].addr.Name(), r.status().message())));
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        stats.bytes_received += r->size();
        ++nodes[i].steps;
        nodes[i].step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
      }
      f->hidden = std::move(*r);
      if (i + 1 < nodes.size()) {
        Send(f, i + 1);
      } else {
        Finish(f, Status::Ok());
      }
    });
  }
};

GridHead::GridHead(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GridHead::~GridHead() {
  Impl& I = *impl_;
  for (auto& f : I.flights) {
    std::unique_lock<std::mutex> lock(I.mu);
    I.cv.wait(lock, [&] { return f->done; });
  }
  I.t->Stop();
}

Result<std::unique_ptr<GridHead>> GridHead::Create(const Model& model, const PagedKv& kv, int32_t n_blocks,
                                                   int max_batch_tokens, int max_logit_rows, ThreadPool& threads,
                                                   const HeadOptions& options) {
  if (options.nodes.empty()) return InvalidArgument("a grid needs at least one node");
  if (!model.part().embed || !model.part().head) return InvalidArgument("the grid's head holds the embeddings and the output head");
  const int n_layer = model.config().n_layer;
  if (options.nodes.front().first_layer != model.part().last_layer) {
    return InvalidArgument(fmt::format("the head runs layers up to {}, but the first node starts at layer {}",
                                       model.part().last_layer - 1, options.nodes.front().first_layer));
  }
  for (size_t i = 0; i < options.nodes.size(); ++i) {
    const NodeAddress& n = options.nodes[i];
    if (n.first_layer >= n.last_layer || (i > 0 && n.first_layer != options.nodes[i - 1].last_layer)) {
      return InvalidArgument(fmt::format("grid node {}: layers must follow the previous node's", n.Name()));
    }
  }
  if (options.nodes.back().last_layer != n_layer) {
    return InvalidArgument(fmt::format("the grid's nodes end at layer {}, the model has layers 0-{}",
                                       options.nodes.back().last_layer - 1, n_layer - 1));
  }
  if (options.depth < 1 || options.depth > 16) return InvalidArgument("grid depth must be in 1..16");
  {
    // A step carries max_batch_tokens rows of hidden state, plus its header and block
    // tables (2 MiB left for those: 64 sequences of 8192 blocks).
    const uint64_t hidden = static_cast<uint64_t>(max_batch_tokens) * static_cast<uint64_t>(model.config().n_embd) * 4;
    if (hidden + (uint64_t{2} << 20) > options.transport.max_message_bytes) {
      return InvalidArgument(fmt::format("a grid step of {} tokens ({} MiB of hidden state) exceeds the transport's "
                                         "{} MiB messages: lower --grid-chunk",
                                         max_batch_tokens, hidden >> 20, options.transport.max_message_bytes >> 20));
    }
  }
  auto impl = std::make_unique<Impl>(model, kv, max_batch_tokens, max_logit_rows, threads, options);
  Impl& I = *impl;
  std::random_device rd;
  I.head_id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  I.hello.head_id = I.head_id;
  I.hello.fingerprint = model.fingerprint();
  I.hello.n_layer = static_cast<uint32_t>(n_layer);
  I.hello.block_size = static_cast<uint32_t>(kv.layout.block_size);
  I.hello.kv_types = kv.layout.TypeCode();
  I.hello.n_blocks = static_cast<uint32_t>(n_blocks);
  I.hello.max_batch_tokens = static_cast<uint32_t>(max_batch_tokens);
  I.hello.max_seqs = static_cast<uint32_t>(std::max(1, std::max(max_logit_rows, options.max_seqs)));
  I.hello.n_ctx = static_cast<uint32_t>(std::min<int64_t>(int64_t{1} << 24, static_cast<int64_t>(n_blocks) * kv.layout.block_size));
  I.hello.store = options.store ? 1 : 0;
  for (const NodeAddress& a : options.nodes) I.nodes.push_back(Impl::Node{a});
  TRELLIS_ASSIGN_OR_RETURN(I.t, net::Transport::Create(options.transport));
  I.t->Sync([&] {
    I.t->SetRequestHandler([&I](net::ConnId c, uint16_t, uint64_t rid, std::string_view) {
      I.t->ReplyError(c, rid, InvalidArgument("a grid head takes no requests"));
    });
    I.t->SetDisconnectHandler([&I](net::ConnId c, const Status& why) {
      for (size_t i = 0; i < I.nodes.size(); ++i) {
        if (I.nodes[i].conn == c) I.NodeFailed(i, c, why);
      }
    });
    return 0;
  });

  // Every node, before serving: a node that is not up yet is retried until start_timeout;
  // a node that refuses (another model, other layers) fails start-up at once.
  const auto deadline = std::chrono::steady_clock::now() + options.start_timeout;
  for (size_t i = 0; i < I.nodes.size(); ++i) {
    for (;;) {
      std::promise<Status> p;
      auto fut = p.get_future();
      I.t->Post([&] { I.Hello(i, [&p](Status st) { p.set_value(std::move(st)); }); });
      Status st = fut.get();
      if (st.ok()) break;
      const bool transient = st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded ||
                             st.code() == StatusCode::kCancelled;
      if (!transient) return st.WithContext(fmt::format("grid node {}", I.nodes[i].addr.Name()));
      if (std::chrono::steady_clock::now() >= deadline) {
        return Unavailable(fmt::format("grid node {} did not answer within {} s: {}", I.nodes[i].addr.Name(),
                                       options.start_timeout.count() / 1000, st.message()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  // The link to each node: round trips of an empty message and of 1 MiB each way.
  auto ping = [&](size_t i, const std::string& body) {
    std::promise<double> p;
    auto fut = p.get_future();
    const auto t0 = std::chrono::steady_clock::now();
    I.t->Post([&] {
      I.t->Call(I.nodes[i].conn, kPing, body, net::After(std::chrono::milliseconds(5000)), [&](Result<std::string> r) {
        p.set_value(r.ok() ? std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() : -1);
      });
    });
    return fut.get();
  };
  const std::string mib(size_t{1} << 20, 'x');
  for (size_t i = 0; i < I.nodes.size(); ++i) {
    std::vector<double> small, large;
    for (int k = 0; k < 16; ++k) {
      if (const double s = ping(i, ""); s >= 0) small.push_back(s);
    }
    for (int k = 0; k < 8; ++k) {
      if (const double s = ping(i, mib); s >= 0) large.push_back(s);
    }
    std::sort(small.begin(), small.end());
    std::sort(large.begin(), large.end());
    const double rtt = small.empty() ? -1 : small[small.size() / 2];
    const double big = large.empty() ? -1 : large[large.size() / 2];
    I.stats.rtt_seconds.push_back(rtt);
    I.stats.bandwidth.push_back(rtt >= 0 && big > rtt ? 2.0 * static_cast<double>(mib.size()) / (big - rtt) : -1);
  }
  {
    // Healthy unless a node failed meanwhile (then it is being reconnected).
    std::lock_guard<std::mutex> lock(I.mu);
    bool all = true;
    for (const Impl::Node& n : I.nodes) all &= n.up;
    I.healthy = all;
  }
  I.seen_epoch = I.epoch.load();
  return std::unique_ptr<GridHead>(new GridHead(std::move(impl)));
}

int GridHead::depth() const { return impl_->opt.depth; }

uint64_t GridHead::epoch() const {
  const uint64_t e = impl_->epoch.load();
  if (e != impl_->seen_epoch) {
    // Slot copies queued on the old epoch (admissions while a node was down, whose
    // Launch failed) name blocks the scheduler is about to give to other sessions: sent
    // with the first step of the new epoch they overwrote those sessions' K/V on the
    // nodes. The scheduler fails every session of the old epoch when it sees this one.
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stats.copies_dropped += impl_->copies.size();
    impl_->copies.clear();
  }
  impl_->seen_epoch = e;
  return e;
}

Status GridHead::Launch(std::span<const SeqBatch> seqs) {
  Impl& I = *impl_;
  if (I.epoch.load() != I.seen_epoch) {
    return Unavailable("a grid node rejoined and the K/V it held is gone; the request was stopped");
  }
  {
    std::lock_guard<std::mutex> lock(I.mu);
    if (!I.healthy) return Unavailable(I.down + "; the head is reconnecting");
  }
  const auto t0 = std::chrono::steady_clock::now();
  TRELLIS_RETURN_IF_ERROR(I.fwd.Prepare(seqs));
  I.fwd.RunLayers();
  const double layers_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto f = std::make_shared<Flight>();
  I.step_seqs.clear();
  for (const SeqBatch& s : seqs) {
    f->n_tokens.push_back(static_cast<int32_t>(s.tokens.size()));
    f->n_logits.push_back(s.n_logits);
    if (s.tokens.empty()) continue;
    StepSeq q;
    q.pos0 = s.pos0;
    q.n_tokens = static_cast<int32_t>(s.tokens.size());
    q.table.assign(s.block_table.begin(), s.block_table.end());
    I.step_seqs.push_back(std::move(q));
  }
  f->prefix = EncodeStepPrefix(I.copies, I.step_seqs);
  f->copies = I.copies.size();
  I.copies.clear();
  const size_t bytes = static_cast<size_t>(I.fwd.hidden_rows()) * static_cast<size_t>(I.model.config().n_embd) * sizeof(float);
  f->hidden.assign(reinterpret_cast<const char*>(I.fwd.hidden()), bytes);
  f->seq.resize(I.nodes.size());
  f->gen.resize(I.nodes.size());
  {
    std::lock_guard<std::mutex> lock(I.mu);
    // A node may have failed or rejoined while the head's layers ran: this batch was
    // planned on the scheduler's view of the old epoch.
    if (I.epoch.load() != I.seen_epoch) {
      return Unavailable("a grid node rejoined and the K/V it held is gone; the request was stopped");
    }
    if (!I.healthy) return Unavailable(I.down + "; the head is reconnecting");
    f->epoch = I.seen_epoch;
    for (size_t i = 0; i < I.nodes.size(); ++i) {
      f->seq[i] = ++I.nodes[i].next_seq;
      f->gen[i] = I.nodes[i].gen;
    }
    ++I.stats.steps;
    I.stats.copies_sent += f->copies;
    I.stats.tokens += static_cast<uint64_t>(I.fwd.hidden_rows());
    I.stats.layers_seconds += layers_s;
  }
  I.flights.push_back(f);
  I.t->Post([&I, f] { I.Send(f, 0); });
  return Status::Ok();
}

Status GridHead::Collect() {
  Impl& I = *impl_;
  if (I.flights.empty()) return Internal("grid head: collect with nothing in flight");
  std::shared_ptr<Flight> f = std::move(I.flights.front());
  I.flights.pop_front();
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(I.mu);
    I.cv.wait(lock, [&] { return f->done; });
    I.stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!f->status.ok()) return f->status;
  }
  const auto t1 = std::chrono::steady_clock::now();
  I.out_hidden.resize(f->hidden.size() / sizeof(float));
  std::memcpy(I.out_hidden.data(), f->hidden.data(), f->hidden.size());
  Status st = I.fwd.ComputeLogits(f->n_tokens, f->n_logits, I.out_hidden.data());
  std::lock_guard<std::mutex> lock(I.mu);
  I.stats.logits_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return st;
}

const float* GridHead::logits_row(int i) const { return impl_->fwd.logits_row(i); }

void GridHead::CopySlots(BlockPool& pool, int32_t src, int32_t dst, int32_t n_slots) {
  pool.CopySlots(src, dst, n_slots);  // the head's own layers, if any
  impl_->copies.push_back({src, dst, n_slots});
}

uint64_t GridHead::current_epoch() const { return impl_->epoch.load(); }

namespace {
// Waits for n answers from the loop thread.
struct Gather {
  std::mutex m;
  std::condition_variable cv;
  size_t left = 0;
  Status status;
  void Done(Status st) {
    std::lock_guard<std::mutex> lock(m);
    if (!st.ok() && status.ok()) status = std::move(st);
    if (--left == 0) cv.notify_all();
  }
  Status Wait(net::Deadline until) {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_until(lock, until, [&] { return left == 0; })) return DeadlineExceeded("grid: nodes did not answer");
    return status;
  }
  void WaitAll() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return left == 0; });
  }
};
constexpr auto kFetchGrace = std::chrono::milliseconds(2000);
}  // namespace

Status GridHead::FetchOnNodes(const store::LookupResult& found, size_t first, std::span<const int32_t> ids,
                              uint64_t block_bytes, uint32_t slices, net::Deadline deadline, store::GetReceipt* receipt) {
  Impl& I = *impl_;
  const size_t n = I.nodes.size();
  std::vector<uint64_t> gens(n);
  {
    std::lock_guard<std::mutex> lock(I.mu);
    if (!I.healthy) return Unavailable(I.down + "; the head is reconnecting");
    for (size_t i = 0; i < n; ++i) gens[i] = I.nodes[i].gen;
  }
  FetchRequest f;
  f.head_id = I.head_id;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - net::Clock::now()).count();
  if (left <= 0) return DeadlineExceeded("no time left to fetch");
  f.deadline_ms = static_cast<uint32_t>(std::min<int64_t>(left, 600000));
  f.block_bytes = block_bytes;
  f.slices = slices;
  f.found_blocks = static_cast<uint32_t>(found.blocks);
  f.runs = found.runs;
  f.first = static_cast<uint32_t>(first);
  f.ids.assign(ids.begin(), ids.end());
  auto g = std::make_shared<Gather>();
  g->left = n;
  auto replies = std::make_shared<std::vector<FetchReply>>(n);
  I.t->Post([&I, g, replies, gens, deadline, body = EncodeFetch(f)] {
    for (size_t i = 0; i < I.nodes.size(); ++i) {
      const net::ConnId conn = I.nodes[i].conn;
      {
        std::lock_guard<std::mutex> lock(I.mu);
        if (!I.nodes[i].up || I.nodes[i].gen != gens[i]) {
          g->Done(Unavailable(fmt::format("grid node {} is down or reconnected", I.nodes[i].addr.Name())));
          continue;
        }
      }
      I.t->Call(conn, kFetch, body, deadline + kFetchGrace, [&I, g, replies, i, conn](Result<std::string> r) {
        FetchReply fr;
        Status st = r.ok() ? DecodeFetchReply(*r, fr) : r.status();
        if (!st.ok()) {
          // No answer, or nonsense: the node may still be writing into its pool.
          I.NodeFailed(i, conn, st);
          return g->Done(Unavailable(fmt::format("grid node {} failed during a store fetch: {}", I.nodes[i].addr.Name(), st.message())));
        }
        (*replies)[i] = fr;
        g->Done(fr.status.ok() ? fr.status : fr.status.WithContext("grid node " + I.nodes[i].addr.Name()));
      });
    }
  });
  Status st = g->Wait(deadline + 2 * kFetchGrace);
  {
    std::lock_guard<std::mutex> lock(I.mu);
    I.stats.node_fetches += n;
    if (!st.ok()) ++I.stats.node_fetch_failures;
    for (size_t i = 0; st.ok() && i < n; ++i) {
      if (I.nodes[i].gen != gens[i]) st = Unavailable("a grid node reconnected during a store fetch");
    }
  }
  if (st.ok() && receipt) {
    const FetchReply& r = (*replies)[0];
    *receipt = store::GetReceipt{r.memory, r.replica, r.ssd, r.remote};
  }
  return st;
}

Status GridHead::GatherFromNodes(std::span<const int32_t> ids, uint64_t block_bytes, uint8_t* out, uint64_t epoch,
                                 net::Deadline deadline) {
  Impl& I = *impl_;
  const size_t n = I.nodes.size();
  const uint64_t layer_bytes = block_bytes / static_cast<uint64_t>(I.model.config().n_layer);
  std::vector<uint64_t> gens(n);
  {
    std::lock_guard<std::mutex> lock(I.mu);
    if (!I.healthy) return Unavailable(I.down + "; the head is reconnecting");
    if (I.epoch.load() != epoch) return Unavailable("a grid node lost its K/V since these blocks were computed");
    for (size_t i = 0; i < n; ++i) gens[i] = I.nodes[i].gen;
  }
  // One read per node and chunk of blocks, every one in flight at once; each answer is
  // copied into its layers' place in `out`.
  struct Part {
    size_t node;
    size_t from, to;  // indices into ids
  };
  std::vector<Part> parts;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t node_bytes = layer_bytes * static_cast<uint64_t>(I.nodes[i].addr.last_layer - I.nodes[i].addr.first_layer);
    const size_t chunk = std::max<size_t>(1, (I.opt.transport.max_message_bytes / 2) / std::max<uint64_t>(node_bytes, 1));
    for (size_t a = 0; a < ids.size(); a += chunk) parts.push_back(Part{i, a, std::min(ids.size(), a + chunk)});
  }
  if (parts.empty()) return Status::Ok();
  auto g = std::make_shared<Gather>();
  g->left = parts.size();
  uint64_t bytes = 0;
  // `out` and `ids` outlive every callback: this function waits for all of them, and a
  // wait that times out fails the nodes (their calls then complete, with an error, first).
  I.t->Post([&I, g, gens, deadline, parts, ids, out, block_bytes, layer_bytes, &bytes] {
    for (const Part& p : parts) {
      const size_t i = p.node;
      const net::ConnId conn = I.nodes[i].conn;
      {
        std::lock_guard<std::mutex> lock(I.mu);
        if (!I.nodes[i].up || I.nodes[i].gen != gens[i]) {
          g->Done(Unavailable(fmt::format("grid node {} is down or reconnected", I.nodes[i].addr.Name())));
          continue;
        }
      }
      ReadRequest r;
      r.head_id = I.head_id;
      r.ids.assign(ids.begin() + static_cast<ptrdiff_t>(p.from), ids.begin() + static_cast<ptrdiff_t>(p.to));
      const uint64_t offset = layer_bytes * static_cast<uint64_t>(I.nodes[i].addr.first_layer);
      const uint64_t node_bytes = layer_bytes * static_cast<uint64_t>(I.nodes[i].addr.last_layer - I.nodes[i].addr.first_layer);
      I.t->Call(conn, kRead, EncodeRead(r), deadline, [&I, g, p, i, conn, out, block_bytes, offset, node_bytes, &bytes](Result<std::string> r) {
        const size_t count = p.to - p.from;
        if (r.ok() && r->size() != count * node_bytes) {
          r = Corrupt(fmt::format("answered {} bytes for {} blocks of {}", r->size(), count, node_bytes));
        }
        if (!r.ok()) {
          if (r.status().code() != StatusCode::kInvalidArgument && r.status().code() != StatusCode::kUnavailable) {
            I.NodeFailed(i, conn, r.status());
          }
          return g->Done(r.status().WithContext("reading blocks from grid node " + I.nodes[i].addr.Name()));
        }
        for (size_t k = 0; k < count; ++k) {
          std::memcpy(out + (p.from + k) * block_bytes + offset, r->data() + k * node_bytes, node_bytes);
        }
        bytes += r->size();
        g->Done(Status::Ok());
      });
    }
  });
  Status st = g->Wait(deadline + kFetchGrace);
  if (!st.ok() && st.code() == StatusCode::kDeadlineExceeded) {
    // Calls still pending hold `out`: fail them (Close completes them) before returning.
    I.t->Sync([&] {
      for (size_t i = 0; i < n; ++i) {
        if (I.nodes[i].conn) I.NodeFailed(i, I.nodes[i].conn, DeadlineExceeded("a read for a publish timed out"));
      }
      return 0;
    });
    g->WaitAll();
  }
  std::lock_guard<std::mutex> lock(I.mu);
  I.stats.gathered_bytes += bytes;
  if (st.ok() && I.epoch.load() != epoch) st = Unavailable("a grid node lost its K/V while its blocks were read");
  for (size_t i = 0; st.ok() && i < n; ++i) {
    if (I.nodes[i].gen != gens[i]) st = Unavailable("a grid node reconnected while its blocks were read");
  }
  return st;
}

HeadHealth GridHead::health() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return HeadHealth{impl_->healthy, impl_->down};
}

HeadStats GridHead::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  HeadStats s = impl_->stats;
  for (const Impl::Node& n : impl_->nodes) {
    s.nodes.push_back({fmt::format("{}:{}", n.addr.host, n.addr.port), n.addr.first_layer, n.addr.last_layer, n.up,
                       n.steps, n.failures, n.step_seconds});
  }
  return s;
}

ExecutorFactory MakeGridExecutor(const Model& model, HeadOptions options, GridHead** out, GridPrefixStore* store) {
  return [&model, options, out, store](const PagedKv& kv, int32_t n_blocks, int max_batch_tokens, int max_logit_rows,
                                       ThreadPool& threads) -> Result<std::unique_ptr<StepExecutor>> {
    auto h = GridHead::Create(model, kv, n_blocks, max_batch_tokens, max_logit_rows, threads, options);
    if (!h.ok()) return h.status();
    if (out) *out = h->get();
    if (store) store->Attach(h->get());
    return std::unique_ptr<StepExecutor>(std::move(h).value());
  };
}

}  // namespace trellis::grid
