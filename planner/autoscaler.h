// AutoscalerPolicy: the decision rule of the SLO autoscaler (docs/planner.md "Autoscaling"). Each
// tick it gets what the router measured over the last window (TTFT, TPOT and queue-time
// percentiles, requests finished, requests waiting / running) and the pools' sizes, and says, per
// pool, whether to add a worker, drain one, or hold:
//
//   * pressure: the prefill pool (or a colocated one) when TTFT or the router's queue time is over
//     its SLO, the decode pool (or a colocated one) when TPOT is;
//   * relief: every watched percentile of the pool under low_water x its SLO, or no traffic at
//     all (nothing finished, waiting or running);
//   * hysteresis: `scale_up_after` consecutive windows of pressure before a worker is added,
//     `scale_down_after` consecutive windows of relief before one is drained, a `cooldown` after
//     every change of a pool (a new worker needs time to load and register, a drained one to
//     finish its streams), and bounds [min, max] per pool. A window with too few finished
//     requests (but traffic) judges nothing.
//
// Pure: no clock, no I/O (the caller passes the time). Thread-safety: not thread-safe; owned by
// the launcher's main loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::planner {

enum class PoolKind { kPrefill, kDecode, kColocated };
const char* PoolKindName(PoolKind k);

struct AutoscalerConfig {
  // Targets, at `percentile` of the window's requests. queue_s 0: not watched.
  double slo_ttft_s = 2.0;
  double slo_tpot_s = 0.05;
  double slo_queue_s = 0;
  double percentile = 0.9;
  int scale_up_after = 2;        // consecutive windows over the SLO before adding a worker
  int scale_down_after = 5;      // consecutive windows of relief before draining one
  double low_water = 0.5;        // relief: under this fraction of the SLO
  std::chrono::milliseconds cooldown{10000};  // after a pool changed, it changes no more this long
  int64_t min_requests = 3;      // finished requests a window needs to be judged (unless idle)
  struct Pool {
    PoolKind kind = PoolKind::kPrefill;
    std::string group;           // the launcher's worker group
    uint32_t min = 1, max = 1;
  };
  std::vector<Pool> pools;

  // Errors: InvalidArgument naming the field (ranges, pools repeated, min > max, min 0).
  Status Validate() const;
};

// What the router measured over one window. NaN percentiles: no sample in the window.
struct WindowObservation {
  double ttft_s = 0, tpot_s = 0, queue_s = 0;
  int64_t finished = 0;   // requests that finished in the window
  double waiting = 0;     // dispatched, no first token yet (now)
  double running = 0;     // streaming (now)
  std::map<std::string, uint32_t> workers;  // group -> processes counted towards its size
};

enum class ScaleAction { kHold, kScaleUp, kScaleDown, kBlockedAtMax, kBlockedAtMin };
const char* ScaleActionName(ScaleAction a);  // hold, scale_up, scale_down, blocked_at_max, blocked_at_min

struct ScaleDecision {
  std::string pool;        // prefill | decode | colocated
  std::string group;
  ScaleAction action = ScaleAction::kHold;
  uint32_t from = 0, to = 0;
  std::string reason;      // the numbers that decided it
};

class AutoscalerPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  // REQUIRES: config.Validate().ok().
  explicit AutoscalerPolicy(AutoscalerConfig config);

  // One decision per pool (kHold included). A pool missing from obs.workers holds.
  std::vector<ScaleDecision> Tick(const WindowObservation& obs, Clock::time_point now);

  const AutoscalerConfig& config() const { return config_; }

 private:
  struct PoolState {
    int pressure = 0, relief = 0;  // consecutive windows
    Clock::time_point last_change{};
    bool changed = false;
  };
  AutoscalerConfig config_;
  std::vector<PoolState> state_;
};

}  // namespace pdserve::planner
