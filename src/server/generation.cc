#include "server/generation.h"

#include <algorithm>
#include <cmath>

namespace trellis::server {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// log-softmax of the chosen token and the `k` most likely ones, from raw logits
// [n_vocab]. Runs on the engine thread: one pass for the max, one for the sum, one for
// the top k (insertion into a k-long sorted list).
void LogProbs(std::span<const float> logits, int32_t chosen, int k, float& lp,
              std::vector<std::pair<int32_t, float>>& top) {
  float mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  lp = logits[static_cast<size_t>(chosen)] - lse;
  top.clear();
  if (k <= 0) return;
  top.reserve(static_cast<size_t>(k) + 1);
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (static_cast<int>(top.size()) == k && x <= top.back().second) continue;
    auto it = std::upper_bound(top.begin(), top.end(), x, [](float v, const auto& e) { return v > e.second; });
    top.insert(it, {static_cast<int32_t>(i), x});
    if (static_cast<int>(top.size()) > k) top.pop_back();
  }
  for (auto& e : top) e.second -= lse;
}

}  // namespace

Generation::Generation(EngineLoop& engine, const Tokenizer& tok, ServerMetrics& metrics, Params p)
    : engine_(engine),
      tok_(tok),
      metrics_(metrics),
      p_(std::move(p)),
      ch_(std::make_shared<Channel>()),
      decoder_(tok, p_.rendered),
      stop_(p_.gen.stop) {}

Generation::~Generation() {
  if (started_ && !done_) Cancel();
}

namespace {

// The OpenAI error of a request the scheduler refused.
ApiError RefusalError(const Verdict& v, const std::string& prompt_param) {
  ApiError e;
  e.message = v.status.message();
  switch (v.refusal) {
    case Refusal::kPromptOverContext:
    case Refusal::kPromptOverPool:
      e.code = "context_length_exceeded";
      e.param = prompt_param;
      break;
    case Refusal::kMaxTokensOverContext:
      e.code = "context_length_exceeded";
      e.param = "max_tokens";
      break;
    case Refusal::kEmptyPrompt:
    case Refusal::kTokenOutsideVocabulary:
      e.param = prompt_param;
      break;
    case Refusal::kNone:
    case Refusal::kBadParameter:
      break;
  }
  return e;
}

}  // namespace

std::optional<ApiError> Generation::Start() {
  Request req;
  req.prompt = p_.prompt;
  const int n_ctx = engine_.options().n_ctx;
  req.max_tokens = p_.gen.max_tokens.value_or(n_ctx - static_cast<int>(p_.prompt.size()));
  // As OpenAI: an explicit max_tokens must fit beside the prompt, rather than be cut short.
  req.max_tokens_must_fit = p_.gen.max_tokens.has_value();
  req.sampling.temperature = p_.gen.temperature;
  req.sampling.top_p = p_.gen.top_p;
  req.sampling.top_k = p_.gen.top_k;
  req.sampling.min_p = p_.gen.min_p;
  req.sampling.repeat_penalty = p_.gen.repeat_penalty;
  req.sampling.presence_penalty = p_.gen.presence_penalty;
  req.sampling.frequency_penalty = p_.gen.frequency_penalty;
  req.sampling.logit_bias = p_.gen.logit_bias;
  req.sampling.repeat_last_n = p_.gen.repeat_last_n;
  req.sampling.seed = p_.gen.seed.value_or(p_.seed);
  req.cache_salt = p_.cache_salt;
  req.grammar = p_.grammar;
  if (Verdict v = engine_.Check(req); !v.ok()) return RefusalError(v, p_.prompt_param);
  const Tokenizer* tok = &tok_;
  if (!p_.gen.ignore_eos) req.is_stop = [tok](int32_t id) { return tok->IsEog(id); };
  req.logits = p_.gen.logprobs;
  const int k = p_.gen.top_logprobs;
  std::shared_ptr<Channel> ch = ch_;
  auto on_token = [ch, k](RequestId, int32_t token, std::span<const float> logits) {
    TokenEvent e{token, NowSeconds(), 0.0f, {}};
    if (!logits.empty()) LogProbs(logits, token, k, e.logprob, e.top);
    {
      std::lock_guard<std::mutex> lock(ch->mu);
      ch->events.push_back(std::move(e));
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
  auto id = engine_.Submit(std::move(req), std::move(on_token), std::move(on_finish));
  if (!id.ok()) {
    ApiError e;
    if (id.status().code() == StatusCode::kResourceExhausted) {
      e.status = 503;
      e.type = "server_error";
      e.code = "server_busy";
    } else if (id.status().code() == StatusCode::kUnavailable) {
      e.status = 503;
      e.type = "server_error";
    }
    e.message = id.status().message();
    return e;
  }
  id_ = *id;
  started_ = true;
  last_token_t_ = NowSeconds();
  return std::nullopt;
}

void Generation::Cancel() {
  if (!started_ || cancelled_) return;
  cancelled_ = true;
  engine_.Cancel(id_);
}

void Generation::Consume(const TokenEvent& e, GenerationDelta& out) {
  if (stop_.stopped()) return;  // tokens generated after a stop string, before the cancel landed
  ++n_tokens_;
  if (n_tokens_ > 1) metrics_.ObserveInterToken(e.t - last_token_t_);
  last_token_t_ = e.t;
  const bool eog = tok_.IsEog(e.token);
  if (p_.gen.logprobs && !eog) {
    TokenLogprob lp{tok_.TokenToPiece(e.token), e.logprob, {}};
    for (const auto& [id, l] : e.top) lp.top.push_back({tok_.TokenToPiece(id), l});
    out.logprobs.push_back(std::move(lp));
  }
  if (eog) return;
  out.text += stop_.Push(decoder_.Push(e.token));
  if (stop_.stopped()) {
    stopped_by_string_ = true;
    metrics_.CountStopString();
    Cancel();
  }
}

void Generation::Finish(GenerationDelta& out) {
  done_ = true;
  out.done = true;
  if (!stop_.stopped()) {
    out.text += stop_.Push(decoder_.Flush());
    out.text += stop_.Flush();
  }
  if (result_.reason == FinishReason::kError) {
    failed_ = true;
    error_message_ = result_.error.message();
    const StatusCode code = result_.error.code();
    error_status_ = (code == StatusCode::kUnavailable || code == StatusCode::kDeadlineExceeded) ? 503 : 500;
  } else if (result_.reason == FinishReason::kCancelled && !stopped_by_string_ && !cancelled_) {
    failed_ = true;  // cancelled from outside (shutdown)
    error_message_ = "the request was cancelled (server shutting down)";
    error_status_ = 503;
  }
  if (!result_.tokens.empty()) metrics_.ObserveTtft(result_.ttft_seconds);
}

GenerationDelta Generation::Next(std::chrono::milliseconds timeout) {
  GenerationDelta out;
  if (done_) {
    out.done = true;
    return out;
  }
  std::vector<TokenEvent> events;
  bool finished = false;
  {
    std::unique_lock<std::mutex> lock(ch_->mu);
    ch_->cv.wait_for(lock, timeout, [&] { return !ch_->events.empty() || ch_->finished; });
    events.swap(ch_->events);
    finished = ch_->finished;
    if (finished) result_ = ch_->result;
  }
  for (const TokenEvent& e : events) Consume(e, out);
  if (finished) Finish(out);
  return out;
}

std::string Generation::finish_reason() const {
  if (stopped_by_string_ || result_.reason == FinishReason::kStop) return "stop";
  return "length";
}

Usage Generation::usage() const {
  Usage u;
  u.prompt_tokens = static_cast<int>(p_.prompt.size());
  u.completion_tokens = n_tokens_;
  u.cached_tokens = result_.n_cached;
  const CacheReceipt& r = result_.cache;
  CacheUsage c;
  c.local = r.local;
  c.store = r.store;
  c.store_memory = r.store_memory;
  c.store_replica = r.store_replica;
  c.store_ssd = r.store_ssd;
  c.store_remote = r.store_remote;
  c.waited_for = r.waited_for;
  c.computed = r.computed;
  for (int k = 1; k < kStoreMissKinds; ++k) {
    if (r.misses[k] > 0) c.miss_reasons.emplace_back(StoreMissName(static_cast<StoreMiss>(k)), r.misses[k]);
  }
  u.cache = std::move(c);
  return u;
}

}  // namespace trellis::server
