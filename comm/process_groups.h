// ProcessGroups: the MPI communicators of one serving instance, built from a ParallelPlan.
//
// Rank layout (parallel_plan.h): world rank = (dp_index * cp + cp_index) * tp + tp_index, and EP
// groups are runs of ep adjacent world ranks:
//
//   world  every rank of the instance (a private duplicate of the caller's communicator)
//   tp     same (dp, cp) index, ordered by tp index      -> TensorParallel
//   cp     same (dp, tp) index, ordered by cp index      -> CpRecordGather
//   dp     same (cp, tp) index, ordered by dp index
//   ep     world ranks [g*ep, (g+1)*ep), ordered by rank -> EpDispatcher
//
// The DP decode coordinator runs on world(), not dp(): EP groups cut across DP ranks (and TP
// peers step together anyway), so the set of ranks that must enter every EP collective in the
// same order is the whole instance.
//
// Create is collective over `world`: every rank must call it. It validates the plan locally,
// then all ranks exchange one small MPI_Allreduce (verdict + plan fingerprint) *before* any
// communicator is split, so a plan that is wrong on any rank, or that differs between ranks,
// makes Create fail on every rank with a clear message instead of leaving some ranks blocked in
// a split the others never enter.
//
// Ownership: owns every communicator (freed on destruction; destroy before MPI_Finalize).
// Threading: the accessors are const and thread-safe; the communicators follow MpiComm's rules.
// Errors: kInvalidArgument for a bad or inconsistent plan (same text on every rank where
// possible), MPI failures as in mpi_status.h.
#pragma once

#include <memory>
#include <string>

#include "comm/mpi_comm.h"
#include "comm/parallel_plan.h"
#include "common/status.h"

namespace pdserve::comm {

// Where this rank sits in each group.
struct RankCoords {
  int world = 0;
  int cp = 0;
  int dp = 0;
  int tp = 0;
  int ep = 0;        // rank inside its EP group
  int ep_group = 0;  // which EP replica group
};

class ProcessGroups {
 public:
  static Result<std::unique_ptr<ProcessGroups>> Create(const MpiComm& world, const ParallelPlan& plan,
                                                       const PlanModelDims& dims);

  // Grid math, usable without MPI (tests, launch scripts, logging). REQUIRES: a plan that
  // passed Validate.
  static RankCoords CoordsOf(const ParallelPlan& plan, int world_rank);
  static int WorldRankOf(const ParallelPlan& plan, int cp_index, int dp_index, int tp_index);

  const ParallelPlan& plan() const { return plan_; }
  const RankCoords& coords() const { return coords_; }
  const MpiComm& world() const { return world_; }
  const MpiComm& tp() const { return tp_; }
  const MpiComm& cp() const { return cp_; }
  const MpiComm& dp() const { return dp_; }
  const MpiComm& ep() const { return ep_; }

  // "world 5/8 cp 0/1 dp 1/2 tp 1/4 ep 5/8 (group 0)" for log lines.
  std::string Describe() const;

 private:
  ProcessGroups() = default;

  ParallelPlan plan_;
  RankCoords coords_;
  MpiComm world_;
  MpiComm tp_;
  MpiComm cp_;
  MpiComm dp_;
  MpiComm ep_;
};

}  // namespace pdserve::comm
