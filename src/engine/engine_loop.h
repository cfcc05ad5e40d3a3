// EngineLoop: the scheduler on its own thread, fed through a queue.
//
// The engine thread owns the scheduler (and through it the pool, radix tree and
// sessions) and runs Step() while there is work, sleeping on a condition variable when
// idle. Other threads call Submit / Cancel, which validate on the caller's thread
// (Scheduler::Validate reads only immutable state), assign an id, and enqueue a typed
// task; errors come back at once, tokens and the final result through the callbacks,
// which run on the engine thread and must be quick (hand the data to the caller's own
// queue or stream).
//
// Thread safety: Submit, Cancel, metrics are thread-safe. Destruction cancels everything
// in flight (finish callbacks run with kCancelled) and joins the thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/scheduler.h"

namespace trellis {

class EngineLoop {
 public:
  // The loop uses `threads` for kernels; model and threads must outlive it.
  static Result<std::unique_ptr<EngineLoop>> Start(const Model& model, const SchedulerOptions& opts,
                                                   ThreadPool& threads, size_t max_queue = 1024);
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // ResourceExhausted when max_queue requests are already waiting to be admitted.
  Result<RequestId> Submit(Request req, TokenCallback on_token, FinishCallback on_finish);
  void Cancel(RequestId id);
  // A snapshot taken after the latest step.
  SchedulerMetrics metrics() const;
  size_t queue_depth() const;
  const SchedulerOptions& options() const { return sched_->options(); }
  // Runs fn on the engine thread between two steps, where it may read the scheduler (the
  // pool, the tree, the sessions; it must not keep references past its return). Returns
  // whether it ran within `timeout`: fn owns what it writes (shared state, not the
  // caller's stack), since it may still run after a timeout. False once stopping.
  bool Inspect(std::function<void(Scheduler&)> fn, std::chrono::milliseconds timeout);
  // Scheduler::Check: the checks Submit makes, with the reason of a refusal. Thread-safe.
  Verdict Check(const Request& req) const { return sched_->Check(req); }

 private:
  EngineLoop() = default;
  void Loop();

  struct Task {
    RequestId id;
    Request req;
    TokenCallback on_token;
    FinishCallback on_finish;
  };

  std::unique_ptr<Scheduler> sched_;
  size_t max_queue_ = 0;
  std::atomic<RequestId> next_id_{1};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Task> tasks_;           // GUARDED_BY(mu_)
  std::vector<RequestId> cancels_;    // GUARDED_BY(mu_)
  std::vector<std::function<void(Scheduler&)>> inspects_;  // GUARDED_BY(mu_)
  SchedulerMetrics snapshot_;         // GUARDED_BY(mu_)
  bool stop_ = false;                 // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace trellis
