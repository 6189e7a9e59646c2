// Scheduler: continuous batching over a BlockPool. Each Schedule() builds one step's batch:
// chunked prefill within a per-step token budget mixed with decode tokens, at most
// max_num_seqs sequences; FCFS admission; when blocks run out, the latest-arrived running
// request is preempted (its blocks freed, recomputed later from scratch).
//
// Policy, per step:
//   1. running requests in arrival order get their next chunk: one decode token, or the next
//      prompt chunk [k*C, min((k+1)*C, prompt_len)) (C = prefill_chunk; a chunk is scheduled
//      whole or not at all, so the cut points never depend on load), or a run of recomputed
//      output tokens (any length). Blocks for the chunk are allocated first; on failure the
//      latest running request is preempted (possibly the one being scheduled) and we retry;
//   2. unless something was preempted this step, waiting requests are admitted in FCFS order
//      while a sequence slot, budget and blocks for their first chunk remain (the head of the
//      queue blocks the rest: no overtaking).
// With whole_prompts (a CP prefill, engine/rank_group.h, needs the prompt in one model call), a
// step is either one waiting request's whole prompt alone (admitted first whenever its blocks
// and a sequence slot are there, whatever its length) or the running requests' output rows.
// Thread-safety: not thread-safe; owned by the engine's step thread.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/request.h"
#include "model/batch.h"

namespace pdserve::engine {

struct SchedulerOptions {
  int64_t max_num_seqs = 64;      // sequences per step
  int64_t max_step_tokens = 512;  // token budget per step (prefill chunks + decode tokens)
  int64_t prefill_chunk = 256;    // C; REQUIRES 1 <= C <= max_step_tokens
  bool whole_prompts = false;     // a prompt is one chunk, in a step of its own (see above)
  Status Validate() const;
};

struct ScheduledChunk {
  Request* request = nullptr;
  int64_t start = 0;   // == request->num_computed
  int64_t n = 0;
  model::RowGrouping grouping = model::RowGrouping::kChunk;
  bool sample = false;  // the chunk ends at the request's last token: sample the next one
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  std::vector<Request*> preempted;  // this step (already back in the waiting queue)
  int64_t n_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, BlockPool* pool);

  // Queues a request (state kWaiting, no blocks). `front` puts it at the head.
  void AddWaiting(Request* r, bool front = false);
  // Adds a request whose KV is complete up to num_computed (imported) to the running set.
  void AddRunning(Request* r);
  // Removes a request from the queues and frees its blocks (unless `keep_blocks`).
  void Remove(Request* r, bool keep_blocks = false);
  // Advances the requests of a finished step: num_computed += n for every chunk.
  void Commit(const SchedulerOutput& out);

  SchedulerOutput Schedule();

  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t total_preemptions() const { return preemptions_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  // The next chunk of r within `budget` tokens (n == 0: nothing fits).
  ScheduledChunk NextChunk(Request* r, int64_t budget) const;
  void Preempt(Request* r, SchedulerOutput* out);

  SchedulerOptions options_;
  BlockPool* pool_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // arrival order
  int64_t preemptions_ = 0;
};

}  // namespace pdserve::engine
