#include "engine/engine.h"

#include <algorithm>

#include <fmt/core.h>

#include "util/clock.h"

namespace trellis {

KvLayout KvLayoutFor(const ModelConfig& c, int block_size) {
  return KvLayout{c.n_layer, c.n_head_kv, c.head_dim, block_size};
}

KvLayout LocalKvLayoutFor(const Model& m, int block_size) {
  KvLayout l = KvLayoutFor(m.config(), block_size);
  l.n_layer = m.n_local_layers();
  return l;
}

Engine::Engine(const Model& model, const EngineOptions& opts)
    : model_(model), opts_(opts), threads_(opts.n_threads) {}

Result<std::unique_ptr<Engine>> Engine::Create(const Model& model, const EngineOptions& in) {
  EngineOptions o = in;
  const ModelConfig& c = model.config();
  if (o.n_threads < 1 || o.n_threads > 256) return InvalidArgument(fmt::format("--threads {} out of range", o.n_threads));
  if (o.block_size < 1 || o.block_size > 4096 || (o.block_size * c.head_dim) % 32 != 0) {
    return InvalidArgument(fmt::format("block size {} is not usable (1..4096, block_size x head_dim a multiple of 32)", o.block_size));
  }
  if (o.n_ctx <= 0) o.n_ctx = c.DefaultContext();
  if (o.max_batch_tokens < 1) return InvalidArgument("max batch tokens must be >= 1");
  if (!model.whole()) return InvalidArgument("the engine runs a whole model, not a part of one");
  const KvLayout layout = KvLayoutFor(c, o.block_size);
  const int64_t per_ctx = (o.n_ctx + o.block_size - 1) / o.block_size;
  int64_t blocks = o.kv_blocks;
  if (blocks <= 0 && o.kv_memory_bytes > 0) blocks = BlockPool::BlocksForBytes(layout, o.kv_memory_bytes);
  if (blocks <= 0 && o.kv_memory_bytes > 0) {
    return InvalidArgument(fmt::format("--kv-memory {} bytes holds no KV block ({} bytes each)", o.kv_memory_bytes, layout.BlockBytes()));
  }
  if (blocks <= 0) blocks = per_ctx;
  if (blocks > (int64_t{1} << 30)) return InvalidArgument("KV pool too large");
  std::unique_ptr<Engine> e(new Engine(model, o));
  TRELLIS_ASSIGN_OR_RETURN(e->pool_, BlockPool::Create(layout, static_cast<int32_t>(blocks)));
  const int logit_rows = o.max_logit_rows > 0 ? o.max_logit_rows : (o.all_logits ? o.max_batch_tokens : 1);
  e->forward_ = std::make_unique<Forward>(model, e->pool_->view(), o.max_batch_tokens, logit_rows, e->threads_, o.n_ctx);
  return e;
}

Result<GenerateResult> Engine::Generate(const GenerateRequest& req, const std::function<bool(int32_t)>& on_token) {
  const ModelConfig& c = model_.config();
  const int bs = opts_.block_size;
  const int n_prompt = static_cast<int>(req.prompt.size());
  if (n_prompt == 0) return InvalidArgument("the prompt is empty");
  if (n_prompt >= opts_.n_ctx) {
    return InvalidArgument(fmt::format("prompt of {} tokens does not fit the context of {} (raise --ctx-size)", n_prompt, opts_.n_ctx));
  }
  for (int32_t t : req.prompt) {
    if (t < 0 || t >= c.n_vocab) return InvalidArgument(fmt::format("token id {} is outside the vocabulary (0..{})", t, c.n_vocab - 1));
  }
  for (int32_t t : req.force_tokens) {
    if (t < 0 || t >= c.n_vocab) return InvalidArgument(fmt::format("forced token id {} is outside the vocabulary (0..{})", t, c.n_vocab - 1));
  }
  const bool forced = !req.force_tokens.empty();
  const int n_steps = forced ? static_cast<int>(req.force_tokens.size()) : req.n_predict;
  if (forced && n_prompt + n_steps > opts_.n_ctx) {
    return InvalidArgument(fmt::format("prompt of {} tokens and {} forced tokens do not fit the context of {}", n_prompt,
                                       n_steps, opts_.n_ctx));
  }

  // The session's block table; blocks go back to the pool whatever happens.
  std::vector<int32_t> table;
  table.reserve(static_cast<size_t>((opts_.n_ctx + bs - 1) / bs));
  struct Releaser {
    BlockPool& pool;
    std::vector<int32_t>& t;
    ~Releaser() { for (int32_t b : t) pool.Release(b); }
  } releaser{*pool_, table};
  auto ensure = [&](int64_t n_positions) -> Status {
    while (static_cast<int64_t>(table.size()) * bs < n_positions) {
      const int32_t b = pool_->Allocate();
      if (b == BlockPool::kNoBlock) {
        return ResourceExhausted(fmt::format("KV pool exhausted: {} blocks of {} tokens in use (raise --kv-memory)",
                                             pool_->n_used(), bs));
      }
      table.push_back(b);
    }
    return Status::Ok();
  };

  GenerateResult res;
  res.n_prompt = n_prompt;
  if (opts_.all_logits) res.prompt_logits.resize(static_cast<size_t>(n_prompt) * c.n_vocab);
  Sampler sampler(req.sampling, c.n_vocab);
  std::vector<int32_t> history(req.prompt);
  history.reserve(req.prompt.size() + static_cast<size_t>(std::max(0, req.n_predict)));

  const double t0 = NowSeconds();
  // Prefill in chunks.
  for (int p = 0; p < n_prompt; p += opts_.max_batch_tokens) {
    const int n = std::min(opts_.max_batch_tokens, n_prompt - p);
    TRELLIS_RETURN_IF_ERROR(ensure(p + n));
    SeqBatch sb;
    sb.tokens = std::span<const int32_t>(req.prompt).subspan(static_cast<size_t>(p), static_cast<size_t>(n));
    sb.pos0 = p;
    sb.block_table = table;
    sb.n_logits = opts_.all_logits ? n : (p + n == n_prompt ? 1 : 0);
    TRELLIS_RETURN_IF_ERROR(forward_->Run(std::span<const SeqBatch>(&sb, 1)));
    if (opts_.all_logits) {
      std::copy_n(forward_->logits_row(0), static_cast<size_t>(n) * c.n_vocab,
                  res.prompt_logits.data() + static_cast<size_t>(p) * c.n_vocab);
    }
  }
  res.prompt_seconds = NowSeconds() - t0;

  std::vector<float> row(static_cast<size_t>(c.n_vocab));
  const float* last = forward_->logits_row(opts_.all_logits ? forward_->logits().size() / c.n_vocab - 1 : 0);
  std::copy_n(last, c.n_vocab, row.data());
  double t_first = 0;
  int pos = n_prompt;
  for (int i = 0; i < n_steps; ++i) {
    const int32_t tok = forced ? req.force_tokens[static_cast<size_t>(i)] : sampler.Sample(row, history, req.prompt.size());
    if (i == 0) {
      t_first = NowSeconds();
      res.ttft_seconds = t_first - t0;
    }
    res.tokens.push_back(tok);
    history.push_back(tok);
    if (on_token && !on_token(tok)) break;
    if (!forced && req.is_eog && req.is_eog(tok)) break;
    if (i + 1 == n_steps && !forced) break;  // forced: the last token is fed too, for its logits
    if (pos + 1 > opts_.n_ctx) {
      res.context_full = true;
      break;
    }
    TRELLIS_RETURN_IF_ERROR(ensure(pos + 1));
    SeqBatch sb;
    sb.tokens = std::span<const int32_t>(&history.back(), 1);
    sb.pos0 = pos;
    sb.block_table = table;
    sb.n_logits = 1;
    TRELLIS_RETURN_IF_ERROR(forward_->Run(std::span<const SeqBatch>(&sb, 1)));
    std::copy_n(forward_->logits_row(0), c.n_vocab, row.data());
    if (opts_.all_logits) res.decode_logits.insert(res.decode_logits.end(), row.begin(), row.end());
    ++pos;
  }
  if (!res.tokens.empty()) res.gen_seconds = NowSeconds() - t_first;
  return res;
}

}  // namespace trellis
