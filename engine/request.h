// Request: one generation request inside the engine (prompt, sampling state, KV blocks,
// progress), and TokenEvent: what the engine reports about it.
//
// A request's tokens are prompt ++ output. Its KV cache holds positions [0, num_computed);
// the scheduler feeds tokens [num_computed, n_tokens()) in chunks: prompt positions in chunks
// aligned to the prefill chunk size (so a prompt is always cut at the same places, whatever
// else runs), output positions one row group per token (model/batch.h). After a preemption
// num_computed drops to 0 and the same chunks are recomputed, bitwise as before.
// Thread-safety: owned by the engine; touched only by its step thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/finish_reason.h"
#include "common/status.h"
#include "engine/block_pool.h"
#include "grammar/matcher.h"
#include "engine/sampler.h"

namespace pdserve::engine {

using RequestId = uint64_t;

// One generated token, or the end of a request. Events of a request arrive in order, on the
// engine's step thread; the last one has finished == true.
struct TokenEvent {
  RequestId id = 0;
  int32_t token = -1;       // -1: no token (abort, error)
  int64_t index = -1;       // position of `token` in the output
  float logprob = 0.0f;     // when SamplingParams::logprobs is set
  // >= 0 on the first event after the request's first scheduled step: seconds it waited
  // from AddRequest (imports: from the applied CommitImport) until that step began.
  double queue_seconds = -1;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string stop_string;  // the stop string that matched (reason kStop by string)
  Status error;             // reason kError
  int64_t prompt_tokens = 0, output_tokens = 0;  // set on the finishing event
  // Set on the finishing event: prompt tokens whose KV came from the prefix cache when the
  // request was first admitted (0 with the cache off, on a miss, or for an import that was
  // never preempted: its prompt KV came with the transfer), or all of them for a twin prompt
  // that copied another request's KV (engine/scheduler.h).
  int64_t cached_prompt_tokens = 0;
  // The finishing event of a constrained request with RequestConstraint::export_state: its
  // grammar matcher state after every output token (GrammarMatcher::Serialize). The prefill
  // side sends it with the first token; CommitImport / RequestConstraint::state restore it.
  std::string constraint_state;
};

// Called on the engine's step thread, never under an engine lock: it may call AddRequest /
// Abort, but must not block for long (every request waits for it).
using EventCallback = std::function<void(const TokenEvent&)>;

// Layer-wise KV export of a prompt (prefill side; engine.h, RequestOptions::kv_export). Both
// hooks run on the step thread, outside every engine lock; they delay every request of the
// step, so they should only queue work.
struct KvExportHooks {
  // Before the forward of the step that computes the prompt's last chunk: the request's
  // blocks (token t in block_ids[t / B]) cover the prompt and stay where they are until
  // ReleaseKv. From this call on, the request keeps its blocks however it ends (also error,
  // abort): the caller reads them until it calls ReleaseKv.
  std::function<void(const std::vector<int32_t>& block_ids)> begin;
  // During that forward, once per layer in order: layer `layer`'s KV of every prompt token
  // (this chunk's and the earlier chunks') is in the blocks and final.
  std::function<void(int64_t layer)> layer_done;
  bool enabled() const { return begin || layer_done; }
};

enum class RequestState : uint8_t { kWaiting, kRunning, kAwaitingKv, kHeld, kFinished };

struct Request {
  RequestId id = 0;
  std::vector<int32_t> tokens;  // prompt ++ output
  int64_t prompt_len = 0;
  SamplingParams params;
  EventCallback on_event;
  bool hold_kv = false;         // keep the blocks after finishing (prefill side)
  KvExportHooks kv_export;
  bool kv_export_begun = false; // kv_export.begin was called: the blocks are kept on any end
  uint64_t seed = 0;
  PenaltyState penalties;
  // Structured output: the matcher of the request's grammar, at the end of its output so far
  // (null: unconstrained). Masks each sampled row; finishes the request when the grammar
  // completes (the stop token it allows was sampled).
  std::optional<grammar::GrammarMatcher> matcher;
  bool export_constraint_state = false;
  RequestState state = RequestState::kWaiting;
  BlockTable blocks;
  int64_t num_computed = 0;     // positions whose KV is in the cache
  int64_t max_len = 0;          // cap on n_tokens(): model context / pool capacity
  int64_t arrival = 0;          // FCFS order
  int64_t preemptions = 0;
  std::chrono::steady_clock::time_point added_at;
  std::chrono::steady_clock::time_point queued_at;  // added_at, or when its import was committed
  bool scheduled_once = false;
  double pending_queue_seconds = -1;  // reported on the next event
  // Prefix cache (docs/prefix-cache.md; maintained by the Scheduler).
  bool cache_kv = true;              // its blocks may be registered (imports: only KV of a known origin)
  std::vector<uint64_t> block_hashes;  // chain hashes of its full blocks, extended as needed
  int64_t chained_blocks = 0;        // leading blocks that are in the cache's chains
  CachedBlockId chain_tail;          // the cached identity of block chained_blocks - 1
  bool chain_ended = false;          // a block could not be registered: none after it will be
  bool prefix_counted = false;       // its first admission went into the counters
  int64_t cached_prompt_tokens = 0;  // prompt tokens found cached at its first admission

  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_output() const { return n_tokens() - prompt_len; }
  bool prefill_done() const { return num_computed >= prompt_len; }
};

// Work the request still owes: prompt tokens to compute here (none while its KV is imported)
// plus output tokens up to max_tokens / its sequence cap.
int64_t QueuedTokens(const Request& r);

}  // namespace pdserve::engine
