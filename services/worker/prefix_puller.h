// PrefixPuller: the puller side of a pull (docs/prefix-cache.md "Pulls"). The router sends a
// prefill job with pull_tokens when another worker's prefix cache holds more of the prompt than
// this one's; the puller brings those blocks here so the prompt computes only what follows:
//
//   Begin(job): the blocks this cache lacks of the prompt's first pull_tokens tokens (whole
//   blocks after its own cached prefix) are allocated in the engine's pool, reserved with the
//   puller's KvReceiver (the pool lives in the transport's region) and announced with kvPull;
//   the router has the holder write them (KvPusher). When the receiver verified the transfer,
//   Engine::AdoptPulledBlocks makes them cached blocks chained after this cache's own prefix, and
//   `on_done` runs: the job then maps them like any cache hit. A failed pull (kvPushFailed, the
//   holder died or was cut off, the lease (config kv_pull_lease: the holder must begin writing
//   within it) or the transfer timed out, a digest mismatch) runs
//   `on_done` as well, with nothing adopted: the prompt is computed. Its blocks go back to the
//   pool only when no writer can still write into them (the receiver's quarantine).
//
// Ids: the receiver knows a pull by PullId(job id), so a pull never collides with a transfer of
// the same job elsewhere.
// Threading: Begin and Fail run on the agent's thread and never block on the engine or the disk:
// Begin only queues. One std::jthread member starts the queued pulls (the local lookup may read
// the disk tier's files), another handles the receiver's events; both run `on_done`, never under
// the puller's lock. Ownership: the host is borrowed and must outlive the puller; the destructor
// stops the threads, drops queued pulls and aborts the pulls in flight without running their
// `on_done`, and returns once their blocks are back in the pool.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "kvtransfer/kv_receiver.h"
#include "services/control/control_messages.h"
#include "services/worker/engine_host.h"
#include "services/worker/import_allocator.h"

namespace pdserve::services::worker {

class PrefixPuller {
 public:
  static uint64_t PullId(uint64_t job_id) { return job_id ^ (uint64_t{1} << 63); }

  // Errors: KvReceiver::Create's.
  static Result<std::unique_ptr<PrefixPuller>> Create(EngineHost* host);
  ~PrefixPuller();
  PrefixPuller(const PrefixPuller&) = delete;
  PrefixPuller& operator=(const PrefixPuller&) = delete;

  // Queues the pull `job` asks for and returns true; `on_done` runs once it ended, whichever way
  // (also when it turns out there is nothing to pull: this cache already holds the prefix, or no
  // blocks or reservation can be had). False (`on_done` never runs) when the job asks for no
  // pull or the cache is off.
  bool Begin(const JobMsg& job, std::function<void()> on_done);
  // Ends the pull of job `job_id` (kvPushFailed, or the job was aborted) if it is still queued
  // or pending.
  void Fail(uint64_t job_id, const Status& why);

 private:
  struct Pull {
    uint64_t job_id = 0;
    std::string tag;
    std::vector<int32_t> tokens;  // the prompt's first end_block * B tokens
    int64_t first_block = 0;
    std::vector<int32_t> blocks;  // engine blocks with one reference each, until adopted or freed
    std::function<void()> on_done;  // empty once run
    std::chrono::steady_clock::time_point began_at{};
  };

  struct Queued {
    uint64_t job_id = 0;
    std::string tag;
    std::vector<int32_t> prefix;  // the prompt's first min(pullTokens, length - 1) tokens
    std::string holder;
    std::function<void()> on_done;
  };

  explicit PrefixPuller(EngineHost* host) : host_(host) {}
  // Reserves and announces a queued pull; false when there is nothing to pull (the caller then
  // runs its on_done).
  bool Start(Queued& q);
  void StartLoop(std::stop_token stop);
  void Loop(std::stop_token stop);
  // The receiver gave the blocks of a failed pull back (no writer can write into them now).
  void OnBlocksFreed(uint64_t pull_id);

  EngineHost* const host_;
  std::unique_ptr<ImportAllocator> allocator_;
  std::unique_ptr<kvtransfer::KvReceiver> receiver_;
  std::mutex mu_;
  std::map<uint64_t, Pull> pulls_;  // by pull id
  std::condition_variable_any queue_cv_;
  std::deque<Queued> queue_;              // pulls not started yet
  std::set<uint64_t> cancelled_;          // job ids failed while queued
  std::jthread thread_;                   // receiver events
  std::jthread start_thread_;             // queued pulls
};

}  // namespace pdserve::services::worker
