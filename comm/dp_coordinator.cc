#include "comm/dp_coordinator.h"

#include <algorithm>

#include <fmt/format.h>

#include "comm/mpi_status.h"

namespace pdserve::comm {

namespace {
constexpr int kFields = 3;
constexpr int64_t kStopFlag = 1;
constexpr int64_t kFailedFlag = 2;
}  // namespace

Result<std::unique_ptr<DpCoordinator>> DpCoordinator::Create(const MpiComm& group) {
  PDSERVE_ASSIGN_OR_RETURN(MpiComm dup, group.Dup());
  return std::unique_ptr<DpCoordinator>(new DpCoordinator(std::move(dup)));
}

Result<DpDecision> DpCoordinator::Sync(const DpVote& vote) {
  if (vote.tokens < 0) return Status::InvalidArgument("DP vote with negative token count");
  const int64_t mine[kFields] = {step_, vote.tokens,
                                 (vote.stop ? kStopFlag : 0) | (vote.failed ? kFailedFlag : 0)};
  gathered_.resize(static_cast<size_t>(size()) * kFields);
  // An allgather rather than an allreduce: one call gives max, sum, idle count, the stop vote
  // in both senses and every rank's step number for the lock-step check.
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Allgather(mine, kFields, MPI_INT64_T, gathered_.data(), kFields,
                                            MPI_INT64_T, comm_.get()),
                              "MPI_Allgather (dp coordinator)");
  DpDecision d;
  d.step = step_++;
  d.my_tokens = vote.tokens;
  bool all_stop = true;
  int failed_rank = -1, out_of_step_rank = -1;
  for (int r = 0; r < size(); ++r) {
    const int64_t* g = &gathered_[static_cast<size_t>(r) * kFields];
    if (g[0] != d.step && out_of_step_rank < 0) out_of_step_rank = r;
    d.max_tokens = std::max(d.max_tokens, g[1]);
    d.total_tokens += g[1];
    if (g[1] == 0) ++d.idle_ranks;
    d.any_stop |= (g[2] & kStopFlag) != 0;
    all_stop &= (g[2] & kStopFlag) != 0;
    if ((g[2] & kFailedFlag) != 0 && failed_rank < 0) failed_rank = r;
  }
  d.stop = all_stop;
  if (out_of_step_rank >= 0) {
    return Status::Internal(fmt::format(
        "DP ranks out of step: coordinator rank {} is at step {}, rank {} at step {}", rank(), d.step,
        out_of_step_rank, gathered_[static_cast<size_t>(out_of_step_rank) * kFields]));
  }
  if (failed_rank >= 0) {
    return Status::Aborted(fmt::format("DP step {}: rank {} reported a failed forward; stopping the group",
                                       d.step, failed_rank));
  }
  return d;
}

Result<DpDecision> DpCoordinator::Step(DpVote vote, const StepFn& forward, const StepFn& dummy) {
  vote.failed |= pending_failure_;
  pending_failure_ = false;
  PDSERVE_ASSIGN_OR_RETURN(DpDecision d, Sync(vote));
  if (!d.run_forward()) return d;
  const Status s = d.my_tokens > 0 ? forward(d) : dummy(d);
  if (!s.ok()) {
    pending_failure_ = true;
    Log()->error("{}: DP step {} {} forward failed: {}", RankTag(), d.step,
                 d.my_tokens > 0 ? "real" : "dummy", s.ToString());
    return s;
  }
  return d;
}

}  // namespace pdserve::comm
