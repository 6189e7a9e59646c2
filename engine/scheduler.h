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
//      queue blocks the rest: no overtaking). With the prefix cache on, a waiting request whose
//      first chunk is the prompt of a running request still in prefill is passed over until
//      that prompt is cached (WaitsForSharedPrefill): it then maps the shared prefix. With
//      twin_prompts, a waiting request whose whole prompt is that of a running request still in
//      prefill (its "twin": `n` > 1 choices, copies of one prompt) is passed over too: when the
//      twin's prompt completes, the engine copies the twin's KV into the request's own blocks
//      and samples its first token from the twin's logits (TakeTwins / AdmitTwin), so no prompt
//      is computed twice, whatever its length (the prefix cache needs a whole first chunk).
// With whole_prompts (a CP prefill, engine/rank_group.h, needs the prompt in one model call), a
// step is either one waiting request's whole prompt alone (admitted first whenever its blocks
// and a sequence slot are there, whatever its length; with a cached prefix, the prompt's rest)
// or the running requests' output rows.
// Prefix cache (PrefixCachePolicy, docs/prefix-cache.md): a request admitted with nothing
// computed first maps the longest cached prefix of its tokens it may use (whole blocks, at
// least first_chunk_tokens of them, never its last token) and starts computing after it (the
// first chunk then runs to the next grid point); after every step, and when an import commits
// (RegisterComputed), the full blocks a request computed join the cache. A request that cannot
// be admitted gives its mapped blocks back; a preempted one releases them and looks up again.
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
  // Twin prompts (below): a waiting request whose prompt is token for token that of a running
  // request still computing it waits, and then takes a copy of its KV (Engine). Off where the
  // KV does not all live in this process's pool (a rank group).
  bool twin_prompts = true;
  Status Validate() const;
};

// How the scheduler uses the pool's prefix cache. Why these rules keep outputs bitwise those of
// a cold run: docs/prefix-cache.md ("Which blocks are interchangeable").
struct PrefixCachePolicy {
  bool enabled = false;
  uint64_t ns = 0;                 // the engine's KvNamespace (engine/block_hash.h)
  // The prefill chunk C: the first chunk's positions are computed in the non-absorbed prefill
  // form, so a hit covers them all or none (hits of fewer tokens are not taken), and a request
  // whose prompt is shorter than C (its KV before C is partly decoded) registers nothing.
  int64_t first_chunk_tokens = 1;
  // Whole-prompt engines (SchedulerOptions::whole_prompts): a cold prompt's every position is
  // computed in the non-absorbed form, its decoded positions in the absorbed one, so only blocks
  // wholly inside a prompt are registered and a hit stays inside the prompt (its rest then runs
  // as a RowGrouping::kPromptRest chunk, in the whole prompt's form).
  bool prompt_blocks_only = false;
};

// Counted at each request's first admission (a preempted request's later lookups are not).
struct PrefixCacheCounters {
  int64_t lookup_tokens = 0;    // prompt tokens looked up
  int64_t hit_tokens = 0;       // of those, found cached
  int64_t computed_tokens = 0;  // of those, left to compute
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
  Scheduler(const SchedulerOptions& options, BlockPool* pool, PrefixCachePolicy prefix = {});

  // Queues a request (state kWaiting, no blocks). `front` puts it at the head.
  void AddWaiting(Request* r, bool front = false);
  // Adds a request whose KV is complete up to num_computed (imported) to the running set.
  void AddRunning(Request* r);
  // Removes a request from the queues and frees its blocks (unless `keep_blocks`).
  void Remove(Request* r, bool keep_blocks = false);
  // Advances the requests of a finished step: num_computed += n for every chunk, then registers
  // the blocks that became full (RegisterComputed).
  void Commit(const SchedulerOutput& out);
  // Registers r's full blocks below num_computed in the prefix cache, in order, while its chain
  // holds (no-op with the cache off, for a request with cache_kv false or a prompt shorter
  // than the first chunk). REQUIRES: the KV of those blocks is final.
  void RegisterComputed(Request* r);

  SchedulerOutput Schedule();

  // Twin prompts (SchedulerOptions::twin_prompts). Whether a request can take part: fresh (no
  // output, nothing computed), unconstrained, no KV export or held blocks.
  static bool Twinnable(const Request& r);
  // The waiting twins of r (whose prompt is complete in this step), removed from the queue: as
  // many as there are free sequence slots (max_num_seqs), in arrival order.
  std::vector<Request*> TakeTwins(const Request& r);
  // t, a twin from TakeTwins whose blocks now hold its whole prompt's KV, joins the running set
  // (num_computed = prompt_len; its lookup counts the whole prompt as found); or goes back to
  // its place in the queue (RequeueTwin) to compute its prompt itself when it got no blocks.
  void AdmitTwin(Request* t);
  void RequeueTwin(Request* t);

  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t total_preemptions() const { return preemptions_; }
  const SchedulerOptions& options() const { return options_; }
  const PrefixCachePolicy& prefix_policy() const { return prefix_; }
  const PrefixCacheCounters& prefix_counters() const { return counters_; }

 private:
  // The next chunk of r within `budget` tokens (n == 0: nothing fits).
  ScheduledChunk NextChunk(Request* r, int64_t budget) const;
  void Preempt(Request* r, SchedulerOutput* out);
  // Maps r's cached prefix into its (empty) block table and sets num_computed; returns the
  // tokens mapped. UnmapCachedPrefix gives them back (r not admitted after all).
  int64_t MapCachedPrefix(Request* r);
  void UnmapCachedPrefix(Request* r);
  // Counts r's lookup (prompt tokens, `mapped` of them cached) at its first admission.
  void CountLookup(Request* r, int64_t mapped);
  // r (waiting, nothing computed) shares its first chunk with a running request that is still
  // computing its prompt: r waits for that prompt's blocks to be cached instead of computing
  // the same chunks beside it (OpenAI `n` > 1, a burst of requests with one system prompt).
  bool WaitsForSharedPrefill(const Request* r) const;
  // r (waiting, twinnable) has a twin running that has not computed its prompt yet.
  bool WaitsForTwin(const Request* r) const;
  // Forgets r's place in the cache's chains (its blocks were released).
  static void ResetChain(Request* r);

  SchedulerOptions options_;
  BlockPool* pool_;
  PrefixCachePolicy prefix_;
  PrefixCacheCounters counters_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // arrival order
  int64_t preemptions_ = 0;
};

}  // namespace pdserve::engine
