#include "common/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>

#include "common/check.h"
#include "common/op_profile.h"

namespace pdserve {

namespace {
// Spin iterations before a worker sleeps, and before the waiting caller yields its core.
constexpr int kWorkerSpins = 4000;
constexpr int kCallerSpins = 2000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
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

void ThreadPool::RunChunks(uint64_t gen) {
  for (;;) {
    uint64_t word = claim_.load(std::memory_order_acquire);
    if ((word >> (2 * kChunkBits)) != gen) return;  // a newer job: this one is drained
    const uint64_t next = word & kChunkMask;
    const uint64_t n_chunks = (word >> kChunkBits) & kChunkMask;
    if (next >= n_chunks) return;
    if (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) continue;
    // The claim succeeded on job `gen`'s word, so the job's parameters are still current: the
    // caller cannot start another job before this chunk is counted done.
    const int64_t begin = static_cast<int64_t>(next) * job_chunk_;
    const int64_t end = std::min(job_n_, begin + job_chunk_);
    (*job_fn_)(begin, end);
    done_chunks_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t min_chunk) {
  if (n <= 0) return;
  Run(n, std::max<int64_t>(std::max<int64_t>(1, min_chunk), (n + n_threads_ * 4 - 1) / (n_threads_ * 4)), fn);
}

void ThreadPool::ParallelForChunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  Run(n, std::max<int64_t>(1, chunk), fn);
}

void ThreadPool::Run(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
  // The claim word holds at most kChunkMask chunks.
  chunk = std::max<int64_t>(chunk, (n + static_cast<int64_t>(kChunkMask) - 1) / static_cast<int64_t>(kChunkMask));
  bool expected = false;
  if (n_threads_ == 1 || n <= chunk || !in_job_.compare_exchange_strong(expected, true)) {
    fn(0, n);  // single chunk, single thread, or nested call: run inline
    return;
  }
  const uint64_t n_chunks = static_cast<uint64_t>((n + chunk - 1) / chunk);
  job_fn_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  done_chunks_.store(0, std::memory_order_relaxed);
  const uint64_t gen = (generation_.load(std::memory_order_relaxed) + 1) & ((1ull << (64 - 2 * kChunkBits)) - 1);
  claim_.store((gen << (2 * kChunkBits)) | (n_chunks << kChunkBits), std::memory_order_release);
  // seq_cst on this store and the load below (and on the worker's side): a Dekker-style
  // handshake, so either we see a sleeper or the sleeper sees the new generation.
  generation_.store(gen);
  if (sleeping_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  OpProfileCountParallelRegion();
  RunChunks(gen);
  OpScope wait(OpProfile::kPoolWait);  // chunks left are running on workers
  for (int spins = 0; done_chunks_.load(std::memory_order_acquire) != static_cast<int64_t>(n_chunks); ++spins) {
    if (spins < kCallerSpins) _mm_pause();
    else std::this_thread::yield();  // a worker holding a chunk was descheduled: let it run
  }
  in_job_.store(false, std::memory_order_release);
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    uint64_t gen;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen && !stop_.load(std::memory_order_acquire)) {
      if (++spins < kWorkerSpins) {
        _mm_pause();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load() != seen || stop_.load(); });
      sleeping_.fetch_sub(1, std::memory_order_acq_rel);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen;
    RunChunks(gen);
  }
}

}  // namespace pdserve
