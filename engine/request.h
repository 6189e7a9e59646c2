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
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/block_pool.h"
#include "engine/sampler.h"

namespace pdserve::engine {

using RequestId = uint64_t;

enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort, kError };
const char* FinishReasonName(FinishReason r);

// One generated token, or the end of a request. Events of a request arrive in order, on the
// engine's step thread; the last one has finished == true.
struct TokenEvent {
  RequestId id = 0;
  int32_t token = -1;       // -1: no token (abort, error)
  int64_t index = -1;       // position of `token` in the output
  float logprob = 0.0f;     // when SamplingParams::logprobs is set
  std::vector<std::pair<int32_t, float>> top_logprobs;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string stop_string;  // the stop string that matched (reason kStop by string)
  Status error;             // reason kError
  int64_t prompt_tokens = 0, output_tokens = 0;  // set on the finishing event
};

// Called on the engine's step thread, never under an engine lock: it may call AddRequest /
// Abort, but must not block for long (every request waits for it).
using EventCallback = std::function<void(const TokenEvent&)>;

enum class RequestState : uint8_t { kWaiting, kRunning, kAwaitingKv, kHeld, kFinished };

struct Request {
  RequestId id = 0;
  std::vector<int32_t> tokens;  // prompt ++ output
  int64_t prompt_len = 0;
  SamplingParams params;
  EventCallback on_event;
  bool hold_kv = false;         // keep the blocks after finishing (prefill side)
  uint64_t seed = 0;
  PenaltyState penalties;
  RequestState state = RequestState::kWaiting;
  BlockTable blocks;
  int64_t num_computed = 0;     // positions whose KV is in the cache
  int64_t max_len = 0;          // cap on n_tokens(): model context / pool capacity
  int64_t arrival = 0;          // FCFS order
  int64_t preemptions = 0;
  std::chrono::steady_clock::time_point added_at;

  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_output() const { return n_tokens() - prompt_len; }
  bool prefill_done() const { return num_computed >= prompt_len; }
};

}  // namespace pdserve::engine
