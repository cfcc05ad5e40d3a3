// Generation: one request's life between an HTTP thread and the engine thread.
//
// The HTTP thread builds it from a typed request, Start()s it (EngineLoop::Submit), then
// pulls text with Next(): token events are queued by the engine-thread callbacks (which
// only copy the id, a timestamp and, if asked, the token's log-probabilities) and turned
// into text on the HTTP thread by a StreamDecoder and a StopMatcher. A matched stop string
// cancels the engine request. Cancel() (client gone, shutdown) does the same.
//
// Thread safety: Start/Next/Cancel/Finish... are called by the one HTTP thread that owns
// the Generation; the engine callbacks touch only the shared Channel, under its mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "model/tokenizer.h"
#include "grammar/token_mask.h"
#include "server/api.h"
#include "server/metrics.h"
#include "server/stop_matcher.h"

namespace trellis::server {

// What Next() produced since the previous call.
struct GenerationDelta {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  bool done = false;
};

class Generation {
 public:
  struct Params {
    std::vector<int32_t> prompt;
    GenerationParams gen;
    uint64_t cache_salt = 0;
    uint64_t seed = 0;  // used when gen.seed is absent
    std::shared_ptr<const grammar::CompiledGrammar> grammar;  // gen.grammar bound to the vocabulary
    std::vector<int32_t> rendered;  // control tokens shown as their text (sorted; tool-call markers)
    std::string prompt_param = "prompt";  // the request field the prompt came from ("messages" for chat)
  };
  // Borrows engine, tokenizer and metrics; they outlive the Generation.
  Generation(EngineLoop& engine, const Tokenizer& tok, ServerMetrics& metrics, Params p);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Submits to the engine. 400: the scheduler refused the request (Scheduler::Check; a
  // prompt or max_tokens over the context is context_length_exceeded, as OpenAI says it);
  // 503: the queue is full or the engine stopping.
  std::optional<ApiError> Start();
  RequestId id() const { return id_; }

  // Waits up to `timeout` for events and returns what they produced.
  GenerationDelta Next(std::chrono::milliseconds timeout);
  // Cancels the engine request (idempotent); Next() will still report done.
  void Cancel();

  // Valid once Next() reported done.
  bool failed() const { return failed_; }
  const std::string& error_message() const { return error_message_; }
  // The HTTP status of a failure: 503 when a peer the engine needs is unavailable (a grid
  // node down or too slow) or the server is shutting down, 500 otherwise.
  int error_status() const { return error_status_; }
  std::string finish_reason() const;
  // The stop string that ended the answer, "" if none did.
  const std::string& stop_string() const { return stop_.matched(); }
  Usage usage() const;

 private:
  struct TokenEvent {
    int32_t token;
    double t;  // steady clock seconds
    float logprob;
    std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
  };
  // Shared with the engine callbacks (which may outlive *this until the finish arrives).
  struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<TokenEvent> events;  // GUARDED_BY(mu)
    bool finished = false;           // GUARDED_BY(mu)
    RequestResult result;            // GUARDED_BY(mu)
  };

  void Consume(const TokenEvent& e, GenerationDelta& out);
  void Finish(GenerationDelta& out);

  EngineLoop& engine_;
  const Tokenizer& tok_;
  ServerMetrics& metrics_;
  Params p_;
  std::shared_ptr<Channel> ch_;
  RequestId id_ = 0;
  bool started_ = false, cancelled_ = false, done_ = false, stopped_by_string_ = false;
  bool failed_ = false;
  std::string error_message_;
  int error_status_ = 500;
  StreamDecoder decoder_;
  StopMatcher stop_;
  int n_tokens_ = 0;  // tokens counted in usage (up to a matched stop string)
  double last_token_t_ = 0;
  RequestResult result_;
};

}  // namespace trellis::server
