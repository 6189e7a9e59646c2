// PrefillPace: the router's estimate of how far one worker has got through the prompt tokens it
// was charged (charge_ledger.h), so that kv_aware routing (routing_policy.h) sees a worker that
// is halfway through a long prefill as half as busy, not as busy as when the prompt was placed.
//
// The router's prefill charges stay whole until the worker's first token: without a pace, a
// worker computing a 2K-token system prompt looks 2K tokens busy until the last moment, and a
// request that shares the prompt is sent to the idle worker to compute it all again, even when
// waiting for the rest of the holder's prefill and computing only its own tail is sooner.
//
// The estimate, per worker:
//   * pace: prompt tokens per second of busy time, learned from the prefills the worker served
//     (a first token came back): each served charge adds its tokens and the busy time since the
//     previous served one (or since the worker went busy) to decayed sums, so jobs served
//     together (a batched prefill) count at their joint pace and a change of speed (another
//     worker sharing the cores) shows within a few jobs;
//   * tokens left: the open charges' tokens minus pace x the time since the last served job
//     (or since the worker went busy), never below zero. With no pace learned yet it is the
//     open tokens, the router's plain accounting.
// A charge closed without being served (cancelled, failed, the worker gone) teaches nothing.
//
// It is advice, like the prefix-cache index: an estimate that is off moves a request to a worker
// that is slower to start it, never to a wrong result.
//
// Thread-safety: none; the ledger writes it under RouterCore's mutex.
#pragma once

#include <chrono>
#include <cstdint>

namespace pdserve::router {

class PrefillPace {
 public:
  using Clock = std::chrono::steady_clock;

  // Each served job's weight in the pace relative to the one before: the last ~4 jobs decide.
  static constexpr double kKeep = 0.75;

  // A prefill charge of `tokens` opened at `now`.
  void Opened(int64_t tokens, Clock::time_point now);
  // A prefill charge of `tokens` closed at `now`; `served`: the worker finished it (its first
  // token came back), so it teaches the pace.
  void Closed(int64_t tokens, bool served, Clock::time_point now);

  // The open charges' tokens the worker has probably not computed yet at `now`.
  int64_t TokensLeft(Clock::time_point now) const;
  int64_t open_tokens() const { return open_tokens_; }
  int64_t open_jobs() const { return open_jobs_; }
  // Prompt tokens per busy second (0: nothing served yet).
  double tokens_per_second() const { return busy_seconds_ > 0 ? served_tokens_ / busy_seconds_ : 0.0; }

 private:
  int64_t open_tokens_ = 0;
  int64_t open_jobs_ = 0;
  Clock::time_point mark_{};  // the worker went busy, or last served a job since
  double served_tokens_ = 0;  // decayed by kKeep per served job
  double busy_seconds_ = 0;   // the same
};

}  // namespace pdserve::router
