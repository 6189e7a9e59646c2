#include "common/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace pdserve {

namespace {
// Spin iterations before a worker sleeps (~50 us of _mm_pause on this machine).
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("PDSERVE_NUM_THREADS")) {
      int n = std::atoi(env);
      if (n > 0) return n;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

void ThreadPool::RunChunks() {
  const int64_t n_chunks = (job_n_ + job_chunk_ - 1) / job_chunk_;
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= n_chunks) break;
    const int64_t begin = c * job_chunk_;
    const int64_t end = std::min(job_n_, begin + job_chunk_);
    (*job_fn_)(begin, end);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t chunk = std::max<int64_t>(std::max<int64_t>(1, min_chunk),
                                          (n + n_threads_ * 4 - 1) / (n_threads_ * 4));
  bool expected = false;
  if (n_threads_ == 1 || n <= chunk || !in_job_.compare_exchange_strong(expected, true)) {
    fn(0, n);  // single chunk, single thread, or nested call: run inline
    return;
  }
  job_fn_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_chunk_.store(0, std::memory_order_relaxed);
  active_workers_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  RunChunks();
  while (active_workers_.load(std::memory_order_acquire) != 0) _mm_pause();
  in_job_.store(false, std::memory_order_release);
}

void ThreadPool::WorkerLoop(int /*worker_index*/) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    uint64_t gen;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen &&
           !stop_.load(std::memory_order_acquire)) {
      if (++spins < kSpinIterations) {
        _mm_pause();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return generation_.load(std::memory_order_acquire) != seen ||
               stop_.load(std::memory_order_acquire);
      });
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen;
    RunChunks();
    active_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace pdserve
