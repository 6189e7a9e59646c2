// HttpThreadPool: the router's HTTP task queue (httplib runs each accepted connection as one
// task, on one thread, for as long as the connection lives). A streaming completion therefore
// holds a thread until its last token. With a fixed pool, as many streams as threads left
// /metrics, /health and every new request waiting in the queue behind them: Prometheus and the
// autoscaler went blind exactly when the load was highest. This pool keeps `warm` threads and
// starts another whenever a connection arrives with none idle, up to `max` (the router sizes it
// above max_outstanding_requests, so a scrape and a 429 always find a thread). Threads, once
// started, stay until shutdown (the pool keeps its high-water mark: no churn under bursts).
//
// Thread-safety: enqueue and shutdown from any thread; shutdown runs the queued tasks, then
// joins every thread (httplib calls it when its listen loop ends).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace pdserve::router {

class HttpThreadPool : public httplib::TaskQueue {
 public:
  // REQUIRES: 1 <= warm <= max.
  HttpThreadPool(size_t warm, size_t max);
  ~HttpThreadPool() override;

  void enqueue(std::function<void()> task) override;
  void shutdown() override;

  size_t threads() const;  // started so far

 private:
  void StartThreadLocked();
  void Run();

  const size_t max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  std::vector<std::thread> threads_;         // guarded by mu_
  size_t idle_ = 0;                          // threads not running a task; guarded by mu_
  bool shutdown_ = false;                    // guarded by mu_
};

}  // namespace pdserve::router
