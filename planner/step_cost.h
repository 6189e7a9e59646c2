// StepCostModel: predicted time of one engine step of one instance, from the model's counts
// (ModelShape) and the hardware's rates (HardwareProfile), under a parallel plan
// (comm::ParallelPlan: cp x dp x tp attention ranks, ep expert ranks).
//
// Every matrix multiply is a roofline of its own: max(FLOPs / rate(dtype, m), weight bytes /
// memory bandwidth), the weights read once per step. Routed experts count the experts a step
// touches on a rank (1 - (1 - k/E)^T of them for T routed tokens) and the rows each gets.
// Attention is the absorbed sparse form (2 dn Lkv + 2 K'(Lkv + dr) + 2 K' Lkv + 2 Lkv dv per
// head and row, K' = min(position + 1, index_topk)), or, with the profile's
// `first_chunk_attention: expanded` (pdserve's CPU engine), the first chunk of a prompt expands
// K/V through kv_b and attends non-absorbed. The Lightning Indexer scores every earlier key
// (2 IH ID per key and row: the quadratic term of a prefill). Communication: EP dispatch +
// combine per MoE layer, TP partial sums per layer and the lm_head gather, CP gathers of the KV
// records per layer, and a DP vote per step. docs/planner.md has the formulas.
//
// Thread-safety: immutable after construction; const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/parallel_plan.h"
#include "planner/hardware_profile.h"
#include "planner/model_shape.h"

namespace pdserve::planner {

// The rows one sequence contributes to a step.
struct StepItem {
  int64_t n_rows = 1;    // tokens computed: a prompt chunk, or 1 for a decode row
  int64_t start = 0;     // tokens already in the cache (position of the first row)
  bool samples = true;   // computes logits (a prompt's last chunk, every decode row)
};

// Seconds by part. `total_s` is their sum.
struct StepCost {
  double linear_s = 0;     // attention + indexer projections, dense / shared FFN, router
  double experts_s = 0;    // routed experts
  double attention_s = 0;  // sparse MLA attention (incl. the expanded first chunk)
  double indexer_s = 0;    // indexer scores + top-k
  double lm_head_s = 0;
  double ep_comm_s = 0, tp_comm_s = 0, cp_comm_s = 0, dp_sync_s = 0;
  double overhead_s = 0;   // per step + per row software costs
  double total_s = 0;

  void Finish() {
    total_s = linear_s + experts_s + attention_s + indexer_s + lm_head_s + ep_comm_s + tp_comm_s + cp_comm_s +
              dp_sync_s + overhead_s;
  }
  StepCost& operator+=(const StepCost& o);
  nlohmann::json ToJson() const;
};

class StepCostModel {
 public:
  // REQUIRES: plan validated against the model (comm::ParallelPlan::Validate).
  StepCostModel(const ModelShape& shape, const HardwareProfile& hw, const comm::ParallelPlan& plan);

  // One step of one DP unit whose rows are `items`; `instance_rows` is the number of rows the
  // whole instance routes to experts this step (every DP unit's rows: sets the EP load).
  // With cp > 1 the items' rows are split evenly over the CP ranks (a whole prompt, ForwardCp).
  StepCost Unit(const std::vector<StepItem>& items, int64_t instance_rows) const;
  // A step in which this unit has no rows but the instance does (the DP dummy forward).
  StepCost Dummy(int64_t instance_rows) const;
  // A prompt of n tokens computed whole in one step (CP prefill or a one-chunk prompt).
  StepCost Prompt(int64_t n) const { return Unit({StepItem{n, 0, true}}, n); }
  // One decode step of `batch` rows each at `context` tokens (every DP unit alike).
  StepCost Decode(int64_t batch, int64_t context) const;

  const comm::ParallelPlan& plan() const { return plan_; }
  int64_t world() const { return plan_.attention_ranks(); }

 private:
  double Gemm(const MatrixSpec& m, int64_t rows, int64_t n_out) const;
  double Collective(int64_t group, double bytes_per_rank, int64_t steps) const;

  const ModelShape& shape_;
  const HardwareProfile& hw_;
  comm::ParallelPlan plan_;
};

}  // namespace pdserve::planner
