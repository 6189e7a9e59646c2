// DpCoordinator: keeps data-parallel decode ranks in lock-step so that expert-parallel
// collectives never deadlock.
//
// Each DP rank schedules its own requests, but every MoE layer is an EP collective that all
// ranks of the EP group must enter. A rank with nothing to decode would otherwise sit out a step
// while its peers block in the all-to-all. So once per engine step every rank calls Sync (one
// small MPI_Allgather of {step, tokens, flags} over the instance) and gets the same decision:
//
//   stop                   every rank voted to stop -> leave the loop (no forward)
//   max_tokens == 0        nobody has work          -> skip the forward (no collectives)
//   my_tokens > 0          run the real forward
//   my_tokens == 0, others > 0  run a *dummy* forward: the same layer sequence with zero
//                          tokens, entering every EP dispatch/combine with n_tokens = 0
//
// Step() wraps this: it calls Sync and then the caller's forward or dummy callback.
//
// Failure handling: a rank whose forward failed passes failed=true at its next Sync; every rank
// then returns kAborted from that Sync (so all leave the loop together instead of some waiting
// forever in a collective). The step counters travel with the votes: ranks that disagree on the
// step number (a missed Sync: a bug) get kInternal on every rank.
//
// The coordinator must span every rank that shares an EP collective with this one: use
// ProcessGroups::world() (EP groups cut across DP ranks).
//
// Ownership: owns a duplicate of the communicator (Create is collective over it).
// Threading: one thread (the engine loop). Errors: as above, MPI failures as in mpi_status.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/mpi_comm.h"
#include "common/status.h"

namespace pdserve::comm {

struct DpVote {
  int64_t tokens = 0;   // tokens this rank would decode this step
  bool stop = false;    // this rank is drained and wants to shut down
  bool failed = false;  // this rank's previous forward failed
};

struct DpDecision {
  int64_t step = 0;          // same on every rank; counts Syncs since creation
  int64_t my_tokens = 0;
  int64_t max_tokens = 0;    // over the group
  int64_t total_tokens = 0;
  int idle_ranks = 0;        // ranks with 0 tokens
  bool any_stop = false;     // some rank voted stop (e.g. start draining)
  bool stop = false;         // every rank voted stop: leave the loop

  bool run_forward() const { return !stop && max_tokens > 0; }
  bool dummy() const { return run_forward() && my_tokens == 0; }
};

class DpCoordinator {
 public:
  static Result<std::unique_ptr<DpCoordinator>> Create(const MpiComm& group);

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  Result<DpDecision> Sync(const DpVote& vote);

  // Sync, then run `forward` (my_tokens > 0) or `dummy` (idle while others step) or nothing.
  // A callback error is remembered and reported to the group at the next Sync (the callback's
  // own error is returned now).
  using StepFn = std::function<Status(const DpDecision&)>;
  Result<DpDecision> Step(DpVote vote, const StepFn& forward, const StepFn& dummy);

  int64_t steps() const { return step_; }

 private:
  explicit DpCoordinator(MpiComm comm) : comm_(std::move(comm)) {}

  MpiComm comm_;
  int64_t step_ = 0;
  bool pending_failure_ = false;
  std::vector<int64_t> gathered_;  // [size x 3]: step, tokens, flags
};

}  // namespace pdserve::comm
