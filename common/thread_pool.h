// ThreadPool: a fixed set of worker threads that run data-parallel loops for the kernels.
//
// Kernels never start threads; callers split work with ParallelFor, which hands contiguous
// index ranges to the workers *and* the calling thread, then returns when every range is done.
// Work is claimed chunk by chunk, so a worker that is slow to wake (or descheduled on an
// oversubscribed machine) never holds the caller up: the caller takes the chunks itself and only
// waits for chunks some worker has actually started. Workers spin briefly before sleeping: a
// decode step runs hundreds of small parallel regions, and waking a sleeping thread costs
// 10-100 us on this VM.
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

  // Like ParallelFor, but in chunks of exactly `chunk` indices (>= 1; the last may be shorter),
  // claimed one by one. For few, costly or uneven items (one row's attention is ~0.2 ms):
  // ParallelFor's n_threads * 4 chunks can leave a thread idle for most of a chunk at the end.
  // Claims cost an atomic each, so keep chunks far above a microsecond of work.
  void ParallelForChunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn);

  // A process-wide pool sized from PDSERVE_NUM_THREADS or the hardware concurrency.
  static ThreadPool& Default();

 private:
  // The claim word packs (job generation, number of chunks, next chunk to claim) so that a
  // worker's successful compare-exchange proves the chunk belongs to the job it read.
  static constexpr int kChunkBits = 20;
  static constexpr uint64_t kChunkMask = (1ull << kChunkBits) - 1;

  void Run(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn);
  void WorkerLoop();
  // Claims and runs chunks of job `gen` until none are left. Returns when the job is drained.
  void RunChunks(uint64_t gen);

  const int n_threads_;
  std::vector<std::thread> workers_;  // joined in the destructor

  // Current job. Written by the caller before it publishes the claim word (release); read by
  // workers after they load the word (acquire) and only while their claim is valid.
  const std::function<void(int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 1;
  std::atomic<uint64_t> claim_{0};        // gen << 40 | n_chunks << 20 | next_chunk
  std::atomic<int64_t> done_chunks_{0};   // chunks of the current job finished
  std::atomic<uint64_t> generation_{0};   // bumped per job; workers wait for a change
  std::atomic<int> sleeping_{0};          // workers blocked on cv_ (notify only if > 0)
  std::atomic<bool> stop_{false};
  std::atomic<bool> in_job_{false};       // detects nested calls

  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace pdserve
