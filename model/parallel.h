// ParallelContext: how this rank takes part in one model instance spread over MPI ranks by a
// parallel plan (comm/parallel_plan.h), and the collectives the forward pass uses. A Model
// loaded with a context (Model::Load(dir, pool, context)) holds only its share of the weights
// and calls these from its layers; without one (or with a one-rank plan) the model is the
// single-process model, on the same code path.
//
// Who holds which rows (docs/parallel.md):
//   * A "unit" is the set of ranks with the same DP index (cp * tp ranks). A unit owns its
//     requests and their KV caches; every rank of the unit holds the same request set and the
//     full KV of each (CP prefill gathers it), so decode steps run replicated across the unit.
//   * Attention heads are split over the TP group (q_b / kv_b rows, o_proj input columns, whole
//     heads: comm::HeadShard); the o_proj partial outputs are summed over TP (SumPartials).
//     lm_head and the embedding are vocabulary-sharded over TP (GatherColumns, EmbedSharded).
//     The indexer and the latent projections stay replicated.
//   * MoE layers: the routed experts are split over the EP group (EpDispatcher). Rows that
//     several ranks hold identically (the unit's replicas in a decode step; the TP peers in a
//     CP prefill) are split between those ranks first, so each row is dispatched once; the
//     outputs are all-gathered back. Each expert's received rows run in one GEMM call, whose
//     per-row results do not depend on the rows beside them, so the expert side computes
//     bitwise what one process would.
//   * CP prefill (Model::ForwardCp): the CP ranks of a unit hold distinct positions of one
//     prompt (comm::CpSplit, zig-zag); each layer all-gathers the new KV records (latent, rope
//     key, indexer key) so every rank's queries see the full causal prefix.
//
// Ownership: owns its communicators and helpers; borrows the ProcessGroups, which must outlive
// it (and it must outlive every Model loaded with it).
// Threading: one thread (MPI_THREAD_FUNNELED): the thread that calls the model's forward.
// Errors: Create is collective over the world and fails with kInvalidArgument (on every rank)
// for a plan that does not fit the model, MPI failures as in comm/mpi_status.h.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/cp_record_gather.h"
#include "comm/cp_split.h"
#include "comm/ep_dispatcher.h"
#include "comm/mpi_comm.h"
#include "comm/process_groups.h"
#include "comm/tensor_parallel.h"
#include "common/op_profile.h"
#include "common/status.h"
#include "model/config.h"
#include "model/weights.h"

namespace pdserve::model {

struct BatchPlan;

// The model dimensions a plan is validated against.
comm::PlanModelDims PlanDimsOf(const ModelConfig& config);

class ParallelContext {
 public:
  // Collective over groups.world(). REQUIRES: groups was created with PlanDimsOf(config).
  static Result<std::unique_ptr<ParallelContext>> Create(const comm::ProcessGroups& groups,
                                                         const ModelConfig& config);
  ~ParallelContext();

  const comm::ProcessGroups& groups() const { return groups_; }
  const comm::ParallelPlan& plan() const { return groups_.plan(); }
  const comm::RankCoords& coords() const { return groups_.coords(); }
  int world_size() const { return groups_.world().size(); }
  bool multi_rank() const { return world_size() > 1; }
  // The weight slice this rank loads (EP experts, TP shards).
  LoadOptions load_options() const;

  // Helpers; null when the corresponding group has one rank (ep_ exists on every multi-rank
  // context, so a CP prefill can count expert rows over the prompt even with ep = 1).
  comm::EpDispatcher* ep() const { return ep_.get(); }
  comm::TensorParallel* tp() const { return tp_.get(); }
  comm::TensorParallel* unit() const { return unit_.get(); }
  comm::TensorParallel* cp_sum() const { return cp_sum_.get(); }
  // The CP record all-gather for records of `record_bytes` (created on first use, collectively
  // over the CP group: every CP rank asks for the same sizes in the same order).
  // REQUIRES: plan().cp > 1.
  Result<comm::CpRecordGather*> CpGather(size_t record_bytes) const;
  // Copies `bytes` from CP rank `root` of this rank's CP group to the others (logits after a
  // CP prefill). REQUIRES: cp_sum() != null.
  Status CpBroadcast(void* data, int64_t bytes, int root) const;

  // Bytes per dispatched MoE row: the bf16 hidden state.
  int64_t dispatch_row_bytes() const { return dispatch_row_bytes_; }
  // Accumulated seconds spent inside communication calls (EP, TP, CP, unit gathers), for
  // benchmarks. Reset with ResetCommSeconds.
  double comm_seconds() const { return comm_seconds_; }
  void AddCommSeconds(double s) const { comm_seconds_ += s; }
  void ResetCommSeconds() const { comm_seconds_ = 0; }
  // Whether the MoE computes the shared expert while its EP exchanges are in flight (default;
  // the first half during the dispatch, the second during the combine). Off: the shared expert
  // runs before the dispatch, so both exchanges are waited for in full (the baseline the
  // overlap is measured against). Either way the numbers are the same.
  bool ep_overlap() const { return ep_overlap_; }
  void set_ep_overlap(bool on) const { ep_overlap_ = on; }

 private:
  ParallelContext(const comm::ProcessGroups& groups) : groups_(groups) {}

  const comm::ProcessGroups& groups_;
  comm::MpiComm unit_comm_, cp_bcast_;
  std::unique_ptr<comm::EpDispatcher> ep_;
  std::unique_ptr<comm::TensorParallel> tp_, unit_, cp_sum_;
  mutable std::vector<std::unique_ptr<comm::CpRecordGather>> cp_gathers_;
  int64_t dispatch_row_bytes_ = 0;
  mutable double comm_seconds_ = 0;
  mutable bool ep_overlap_ = true;
};

// Per-call parallel state of one forward (internal to model/).
struct ParallelStep {
  const ParallelContext* ctx = nullptr;  // null: single process
  const comm::CpSplit* cp = nullptr;     // set: a CP prefill, rows = this CP rank's positions
  // The split's position p is the sequence's position cp_start + p: a prompt's rest after a
  // cached prefix of cp_start tokens (RowGrouping::kPromptRest) is split, not its prefix.
  int64_t cp_start = 0;
  // The group whose ranks hold this call's rows identically (MoE rows are split over it):
  // the TP group in a CP prefill, the unit otherwise; null when no split (one rank, or ep = 1).
  comm::TensorParallel* replicas = nullptr;

  bool parallel_moe() const { return ctx && ctx->multi_rank(); }
};

// Rows [first, second) of a plan that replica `index` of `n` dispatches: contiguous, from
// index * n_rows / n to (index + 1) * n_rows / n.
std::pair<int64_t, int64_t> ReplicaRowRange(const BatchPlan& plan, int n, int index);

// Times a communication call into ctx->comm_seconds() (and the MPI op of a profiled step).
class CommTimer {
 public:
  explicit CommTimer(const ParallelContext* ctx);
  ~CommTimer();

 private:
  OpScope scope_;
  const ParallelContext* ctx_;
  int64_t start_ns_;
};

}  // namespace pdserve::model
