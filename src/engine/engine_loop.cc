#include "engine/engine_loop.h"

#include <fmt/core.h>

namespace trellis {

Result<std::unique_ptr<EngineLoop>> EngineLoop::Start(const Model& model, const SchedulerOptions& opts,
                                                      ThreadPool& threads, size_t max_queue) {
  std::unique_ptr<EngineLoop> l(new EngineLoop());
  TRELLIS_ASSIGN_OR_RETURN(l->sched_, Scheduler::Create(model, opts, threads));
  l->max_queue_ = max_queue;
  l->snapshot_ = l->sched_->metrics();
  l->tasks_.reserve(64);
  l->thread_ = std::thread([p = l.get()] { p->Loop(); });
  return l;
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<RequestId> EngineLoop::Submit(Request req, TokenCallback on_token, FinishCallback on_finish) {
  TRELLIS_RETURN_IF_ERROR(sched_->Validate(req));
  const RequestId id = next_id_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Unavailable("the engine is shutting down");
    if (tasks_.size() + static_cast<size_t>(snapshot_.waiting) >= max_queue_) {
      return ResourceExhausted(fmt::format("the request queue is full ({} waiting)", tasks_.size() + snapshot_.waiting));
    }
    tasks_.push_back(Task{id, std::move(req), std::move(on_token), std::move(on_finish)});
  }
  cv_.notify_one();
  return id;
}

void EngineLoop::Cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_one();
}

SchedulerMetrics EngineLoop::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

size_t EngineLoop::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.size() + static_cast<size_t>(snapshot_.waiting);
}

bool EngineLoop::Inspect(std::function<void(Scheduler&)> fn, std::chrono::milliseconds timeout) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool ran = false;
  };
  auto done = std::make_shared<Done>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    inspects_.push_back([fn = std::move(fn), done](Scheduler& s) {
      fn(s);
      std::lock_guard<std::mutex> l(done->mu);
      done->ran = true;
      done->cv.notify_all();
    });
  }
  cv_.notify_one();
  std::unique_lock<std::mutex> lock(done->mu);
  return done->cv.wait_for(lock, timeout, [&] { return done->ran; });
}

void EngineLoop::Loop() {
  std::vector<Task> tasks;
  std::vector<RequestId> cancels;
  std::vector<std::function<void(Scheduler&)>> inspects;
  tasks.reserve(64);
  bool busy = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto woken = [&] { return stop_ || !tasks_.empty() || !cancels_.empty() || !inspects_.empty(); };
      if (!busy && sched_->store_pending()) {
        // Idle, but the store still has publishes (holding pinned blocks) or fetches out:
        // step again soon to collect them.
        cv_.wait_for(lock, std::chrono::milliseconds(5), woken);
      } else if (!busy) {
        cv_.wait(lock, woken);
      }
      if (stop_) break;
      tasks.swap(tasks_);
      cancels.swap(cancels_);
      inspects.swap(inspects_);
    }
    for (auto& fn : inspects) fn(*sched_);
    inspects.clear();
    for (Task& t : tasks) {
      auto r = sched_->Submit(std::move(t.req), std::move(t.on_token), t.on_finish, t.id);
      if (!r.ok() && t.on_finish) {
        RequestResult res;
        res.reason = FinishReason::kError;
        res.error = r.status();
        t.on_finish(t.id, res);
      }
    }
    tasks.clear();
    for (RequestId id : cancels) sched_->Cancel(id);
    cancels.clear();
    busy = sched_->Step();
    SchedulerMetrics m = sched_->metrics();
    std::lock_guard<std::mutex> lock(mu_);
    snapshot_ = m;
  }
  // Shutting down: cancel whatever is queued or running so every caller hears back.
  std::vector<Task> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(tasks_);
  }
  for (Task& t : rest) {
    if (t.on_finish) {
      RequestResult res;
      res.reason = FinishReason::kCancelled;
      t.on_finish(t.id, res);
    }
  }
  sched_->CancelAll();
}

}  // namespace trellis
