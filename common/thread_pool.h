// ThreadPool: a fixed set of worker threads that run data-parallel loops for the kernels.
//
// Kernels never start threads; callers split work with ParallelFor, which hands contiguous
// index ranges to the workers *and* the calling thread, then returns when every range is done.
// Workers spin for a short while before sleeping: a decode step runs thousands of small
// parallel regions, and waking a sleeping thread costs 10-100 us on this VM.
//
// Thread-safety: ParallelFor may be called from one thread at a time (the owner of the pool,
// e.g. the engine loop). Nested ParallelFor calls run inline on the calling thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pdserve {

class ThreadPool {
 public:
  // n_threads counts the caller: n_threads == 1 runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(begin, end) over [0, n) split into about n_threads * 4 chunks of at least
  // min_chunk indices. Blocks until all chunks are done.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t min_chunk = 1);

  // A process-wide pool sized from PDSERVE_NUM_THREADS or the hardware concurrency.
  static ThreadPool& Default();

 private:
  void WorkerLoop(int worker_index);
  void RunChunks();

  const int n_threads_;
  std::vector<std::thread> workers_;  // joined in the destructor

  // The current job; written by the caller before bumping generation_ (release), read by
  // workers after observing the new generation (acquire).
  const std::function<void(int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 1;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> active_workers_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> in_job_{false};

  std::mutex mu_;
  std::condition_variable cv_;  // wakes sleeping workers on a new generation or stop
};

}  // namespace pdserve
