// The public Engine (include/trellis/engine.h) over the runtime: a model, its tokenizer,
// a thread pool, an EngineLoop (the scheduler on its own thread) and, with a store, a
// StoreBridge. Generate submits a request and waits for its tokens on a channel of its
// own, as the HTTP server's Generation does.
#include "trellis/engine.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include <fmt/format.h>

#include "engine/engine_loop.h"
#include "engine/model.h"
#include "engine/store_bridge.h"
#include "kernels/cpu_features.h"
#include "model/tokenizer.h"
#include "util/cpus.h"
#include "util/thread_pool.h"

namespace trellis {

struct Engine::Impl {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ThreadPool> threads;
  std::unique_ptr<StoreBridge> store;
  std::unique_ptr<EngineLoop> loop;  // last: stopped before what it uses goes
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { impl_->loop.reset(); }

Result<std::unique_ptr<Engine>> Engine::Open(const EngineConfig& c) {
  if (c.threads < 0 || c.threads > 256) return InvalidArgument(fmt::format("threads {} out of range (0..256)", c.threads));
  if (c.ctx_size < 0) return InvalidArgument("ctx_size must be >= 0");
  if (c.kv_memory_bytes < 0) return InvalidArgument("kv_memory_bytes must be >= 0");
  if (c.max_running < 1 || c.max_running > 4096) return InvalidArgument("max_running must be in 1..4096");
  auto impl = std::make_unique<Impl>();
  TRELLIS_ASSIGN_OR_RETURN(impl->model, Model::Load(c.model_path));
  TRELLIS_ASSIGN_OR_RETURN(impl->tok, Tokenizer::FromGguf(impl->model->gguf()));
  impl->threads = std::make_unique<ThreadPool>(c.threads > 0 ? c.threads : ProbeCpus().threads);
  if (!c.store.empty()) {
    StoreBridgeOptions bo;
    bo.client.servers = {c.store};
    bo.client.local = c.store;
    bo.client.require_reachable = false;  // a cache never keeps the engine from starting
    TRELLIS_ASSIGN_OR_RETURN(impl->store, StoreBridge::Connect(bo));
  }
  SchedulerOptions so;
  so.block_size = c.block_size;
  so.n_ctx = c.ctx_size;
  so.kv_memory_bytes = c.kv_memory_bytes;
  so.max_running = c.max_running;
  so.prefix_cache = c.prefix_cache;
  so.store = impl->store.get();
  TRELLIS_ASSIGN_OR_RETURN(impl->loop, EngineLoop::Start(*impl->model, so, *impl->threads));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

namespace {

// What the engine thread hands the caller's thread.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int32_t> tokens;
  bool finished = false;
  RequestResult result;
};

const char* FinishName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength:
    case FinishReason::kContextFull: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

}  // namespace

Result<Completion> Engine::Generate(std::span<const int32_t> prompt, const GenerateOptions& o, const TokenSink& sink) {
  Impl& I = *impl_;
  Request req;
  req.prompt.assign(prompt.begin(), prompt.end());
  req.max_tokens = o.max_tokens;
  req.max_tokens_must_fit = false;  // a generation stops at the context's end ("length")
  req.sampling.temperature = o.temperature;
  req.sampling.top_p = o.top_p;
  req.sampling.top_k = o.top_k;
  req.sampling.min_p = o.min_p;
  req.sampling.repeat_penalty = o.repeat_penalty;
  req.sampling.seed = o.seed;
  req.cache_salt = o.cache_salt;
  const Tokenizer* tok = I.tok.get();
  if (o.stop_at_end) req.is_stop = [tok](int32_t id) { return tok->IsEog(id); };
  if (Verdict v = I.loop->Check(req); !v.ok()) return v.status;

  auto ch = std::make_shared<Channel>();
  auto on_token = [ch](RequestId, int32_t token, std::span<const float>) {
    {
      std::lock_guard<std::mutex> lock(ch->mu);
      ch->tokens.push_back(token);
    }
    ch->cv.notify_one();
  };
  auto on_finish = [ch](RequestId, const RequestResult& r) {
    {
      std::lock_guard<std::mutex> lock(ch->mu);
      ch->finished = true;
      ch->result = r;
    }
    ch->cv.notify_one();
  };
  TRELLIS_ASSIGN_OR_RETURN(RequestId id, I.loop->Submit(std::move(req), std::move(on_token), std::move(on_finish)));

  Completion out;
  StreamDecoder decoder(*I.tok);
  bool stopped = false;  // the sink said stop: cancel, and drain to the finish
  std::unique_lock<std::mutex> lock(ch->mu);
  for (;;) {
    ch->cv.wait(lock, [&] { return !ch->tokens.empty() || ch->finished; });
    while (!ch->tokens.empty()) {
      const int32_t t = ch->tokens.front();
      ch->tokens.pop_front();
      if (stopped) continue;
      lock.unlock();
      // An end token closes the generation; it is not part of the text.
      const bool end = o.stop_at_end && I.tok->IsEog(t);
      out.tokens.push_back(t);
      const std::string piece = end ? std::string() : decoder.Push(t);
      out.text += piece;
      if (sink && !sink(piece, t)) {
        stopped = true;
        I.loop->Cancel(id);
      }
      lock.lock();
    }
    if (ch->finished) break;
  }
  const RequestResult r = ch->result;
  lock.unlock();
  if (r.reason == FinishReason::kError) return r.error;
  const std::string tail = decoder.Flush();
  out.text += tail;
  if (sink && !tail.empty() && !stopped) sink(tail, -1);
  out.finish_reason = stopped ? "stop" : FinishName(r.reason);
  out.receipt.prompt_tokens = r.n_prompt;
  out.receipt.cached = r.cache.local;
  out.receipt.store = r.cache.store;
  out.receipt.computed = r.cache.computed;
  out.ttft_seconds = r.ttft_seconds;
  out.total_seconds = r.total_seconds;
  return out;
}

Result<Completion> Engine::Generate(std::string_view prompt, const GenerateOptions& o, const TokenSink& sink) {
  const std::vector<int32_t> ids = impl_->tok->Encode(prompt, o.add_bos && impl_->tok->add_bos(), /*parse_special=*/true);
  return Generate(std::span<const int32_t>(ids), o, sink);
}

std::vector<int32_t> Engine::Tokenize(std::string_view text, bool add_bos) const {
  return impl_->tok->Encode(text, add_bos && impl_->tok->add_bos(), /*parse_special=*/true);
}

std::string Engine::Detokenize(std::span<const int32_t> tokens) const { return impl_->tok->Decode(tokens); }

ModelInfo Engine::info() const {
  const ModelConfig& c = impl_->model->config();
  ModelInfo m;
  m.architecture = c.arch;
  m.n_vocab = c.n_vocab;
  m.n_layer = c.n_layer;
  m.n_embd = c.n_embd;
  m.ctx_size = impl_->loop->options().n_ctx;
  m.kernels = KernelPathName();
  return m;
}

}  // namespace trellis
