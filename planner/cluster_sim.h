// ClusterSim: a discrete-event simulation of a pdserve cluster serving a workload, with every
// engine step timed by StepCostModel. It replays what the services do (docs/engine.md,
// docs/services.md, docs/router.md), not a queueing formula:
//
//   * router: a prefill instance by least outstanding prompt tokens, a decode DP unit by most
//     free KV, a colocated instance by least outstanding tokens (ties: the lowest index);
//   * prefill instance: the engine's scheduler (running requests' next chunk on the fixed grid
//     [kC, (k+1)C), then FCFS admission under max_step_tokens / max_num_seqs); with cp > 1 one
//     whole prompt per step. The prompt's KV then moves to the decode unit, layer-streamed: the
//     tail after the forward is the last layer's bytes (or what the link could not overlap),
//     and the prefill's transfer thread finishes transfers one at a time;
//   * decode instance: its DP units step in lock-step (the step takes the slowest unit's time,
//     a unit without rows runs the dummy forward); a committed request joins the next step;
//   * colocated instance: decode rows and prompt chunks share the steps under the same budget.
//
// Client-side times follow pdserve-loadgen (bench/loadgen/stats.h): TTFT = first token at the
// client - send; TPOT = (last token - first token) / (output tokens - 1).
//
// Deterministic for a given seed. Thread-safety: Run is a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/parallel_plan.h"
#include "planner/step_cost.h"

namespace pdserve::planner {

struct Workload {
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0;     // lengths uniform in len * (1 +- range), as pdserve-loadgen
  double rate_rps = 1;        // Poisson arrivals; <= 0 or inf: all at once
  int64_t num_requests = 400;
  int64_t warmup = 0;         // first requests not counted in the percentiles
  uint64_t seed = 1;          // arrivals as pdserve-loadgen --seed draws them (cluster_sim.cc)
};

struct SchedulerLimits {  // engine/scheduler.h defaults
  int64_t max_num_seqs = 64;
  int64_t max_step_tokens = 512;
  int64_t prefill_chunk = 256;
};

struct PoolSpec {
  int64_t instances = 0;
  comm::ParallelPlan plan;
  int64_t kv_capacity_tokens = 0;  // per DP unit (decode, colocated); 0: unlimited
};

struct ClusterSpec {
  bool colocated = false;
  PoolSpec prefill, decode;  // disaggregated
  PoolSpec colocated_pool;   // colocated
  SchedulerLimits limits;
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};

struct SimResult {
  int64_t completed = 0;            // measured requests (after warm-up)
  double duration_s = 0;            // first measured send -> last measured completion
  Percentiles ttft, tpot, queue;    // queue: send -> first scheduled step (prefill / colocated)
  double throughput_rps = 0, output_tokens_per_s = 0;
  double mean_decode_batch = 0;     // decode rows per instance step, over steps that have any
  double prefill_busy = 0, decode_busy = 0;  // fraction of time instances were stepping
  // Requests/s whose TTFT and TPOT both met the SLO (loadgen's goodput).
  double Goodput(double slo_ttft_s, double slo_tpot_s) const;
  double Attainment(double slo_ttft_s, double slo_tpot_s) const;
  std::vector<double> ttft_s, tpot_s;  // per measured request (tpot 0 for 1-token outputs)
};

// REQUIRES: the cost models outlive the call; decode/prefill models for disaggregated specs,
// `colocated` for colocated ones (the others may be null).
SimResult SimulateCluster(const ClusterSpec& spec, const Workload& w, const StepCostModel* prefill,
                          const StepCostModel* decode, const StepCostModel* colocated, const HardwareProfile& hw,
                          const ModelShape& shape);

// The send times of n requests at `rate_rps` (Poisson; <= 0 or inf: all at 0), drawn exactly as
// pdserve-loadgen draws them for `--seed seed` (loadgen::AssignPoissonArrivals; the two are
// compared by loadgen_stats_test), so a simulation can replay the schedule of a measured run.
std::vector<double> PoissonArrivals(int64_t n, double rate_rps, uint64_t seed);

// Linear interpolation between closest ranks (numpy's default), as pdserve-loadgen.
double Percentile(std::vector<double> v, double q);

}  // namespace pdserve::planner
