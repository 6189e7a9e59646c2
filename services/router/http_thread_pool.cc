#include "services/router/http_thread_pool.h"

namespace pdserve::router {

HttpThreadPool::HttpThreadPool(size_t warm, size_t max) : max_(max < 1 ? 1 : max) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < warm && i < max_; ++i) StartThreadLocked();
}

HttpThreadPool::~HttpThreadPool() { shutdown(); }

void HttpThreadPool::StartThreadLocked() {
  ++idle_;  // counted idle from the start: it takes a task as soon as it runs
  threads_.emplace_back([this] { Run(); });
}

void HttpThreadPool::enqueue(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return;  // httplib stops enqueueing before it shuts the queue down
  tasks_.push_back(std::move(task));
  // Every started thread busy (each may hold a stream for minutes): one more, within the bound;
  // at the bound the task waits for the next thread that finishes.
  if (idle_ < tasks_.size() && threads_.size() < max_) StartThreadLocked();
  cv_.notify_one();
}

void HttpThreadPool::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_ && threads_.empty()) return;
    shutdown_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

size_t HttpThreadPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

void HttpThreadPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return shutdown_ || !tasks_.empty(); });
    if (tasks_.empty()) {  // shut down with nothing left to run
      --idle_;
      return;
    }
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    --idle_;
    lock.unlock();
    task();
    lock.lock();
    ++idle_;
  }
}

}  // namespace pdserve::router
