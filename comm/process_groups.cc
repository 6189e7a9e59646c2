#include "comm/process_groups.h"

#include <array>
#include <climits>

#include <fmt/format.h>

#include "comm/mpi_status.h"

namespace pdserve::comm {

namespace {

// The fields every rank must agree on. Each is reduced with MAX twice (as x and as -x), which
// yields min and max in one MPI_Allreduce.
enum Field { kOk, kCp, kDp, kEp, kTp, kExperts, kHeads, kVocab, kFirstBadRank, kNumFields };

Status AgreeOnPlan(const MpiComm& world, const ParallelPlan& plan, const PlanModelDims& dims,
                   const Status& local) {
  std::array<int64_t, kNumFields> mine = {local.ok() ? 1 : 0, plan.cp, plan.dp, plan.ep, plan.tp,
                                          dims.n_routed_experts, dims.num_attention_heads,
                                          dims.vocab_size, local.ok() ? INT64_MAX : world.rank()};
  std::array<int64_t, 2 * kNumFields> both;
  for (int i = 0; i < kNumFields; ++i) {
    both[i] = mine[i];
    both[kNumFields + i] = -mine[i];
  }
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Allreduce(MPI_IN_PLACE, both.data(), 2 * kNumFields, MPI_INT64_T,
                                            MPI_MAX, world.get()),
                              "MPI_Allreduce (parallel plan agreement)");
  const auto max_of = [&](int f) { return both[f]; };
  const auto min_of = [&](int f) { return -both[kNumFields + f]; };

  // A rank whose own validation failed reports its own message: with identical configs that is
  // the same message on every rank.
  if (!local.ok()) return local;
  if (min_of(kOk) == 0) {
    return Status::InvalidArgument(fmt::format(
        "parallel plan [{}] was rejected by rank {} (see its log); this rank accepted it, so the "
        "ranks were started with different plans or model configs", plan.ToString(), min_of(kFirstBadRank)));
  }
  for (int f = kCp; f <= kVocab; ++f) {
    if (min_of(f) != max_of(f)) {
      static constexpr const char* kNames[] = {"ok", "cp", "dp", "ep", "tp", "n_routed_experts",
                                               "num_attention_heads", "vocab_size"};
      return Status::InvalidArgument(fmt::format(
          "ranks disagree on the parallel plan: {} ranges from {} to {} across ranks (this rank: "
          "[{}]); start every rank with the same plan and model", kNames[f], min_of(f), max_of(f),
          plan.ToString()));
    }
  }
  return Status::Ok();
}

}  // namespace

RankCoords ProcessGroups::CoordsOf(const ParallelPlan& plan, int world_rank) {
  RankCoords c;
  c.world = world_rank;
  c.tp = world_rank % plan.tp;
  c.cp = (world_rank / plan.tp) % plan.cp;
  c.dp = world_rank / (plan.tp * plan.cp);
  c.ep = world_rank % plan.ep;
  c.ep_group = world_rank / plan.ep;
  return c;
}

int ProcessGroups::WorldRankOf(const ParallelPlan& plan, int cp_index, int dp_index, int tp_index) {
  return (dp_index * plan.cp + cp_index) * plan.tp + tp_index;
}

Result<std::unique_ptr<ProcessGroups>> ProcessGroups::Create(const MpiComm& world,
                                                             const ParallelPlan& plan,
                                                             const PlanModelDims& dims) {
  if (!world.valid()) return Status::FailedPrecondition("ProcessGroups::Create on a null communicator");
  const Status local = plan.Validate(world.size(), dims);
  if (!local.ok()) Log()->error("{}: {}", RankTag(), local.message());
  PDSERVE_RETURN_IF_ERROR(AgreeOnPlan(world, plan, dims, local));

  std::unique_ptr<ProcessGroups> g(new ProcessGroups());
  g->plan_ = plan;
  g->coords_ = CoordsOf(plan, world.rank());
  const RankCoords& c = g->coords_;
  // Every rank runs the same sequence of splits, so they match up collective by collective.
  PDSERVE_ASSIGN_OR_RETURN(g->world_, world.Dup());
  PDSERVE_ASSIGN_OR_RETURN(g->tp_, world.Split(c.dp * plan.cp + c.cp, c.tp));
  PDSERVE_ASSIGN_OR_RETURN(g->cp_, world.Split(c.dp * plan.tp + c.tp, c.cp));
  PDSERVE_ASSIGN_OR_RETURN(g->dp_, world.Split(c.cp * plan.tp + c.tp, c.dp));
  PDSERVE_ASSIGN_OR_RETURN(g->ep_, world.Split(c.ep_group, c.ep));

  // The split keys make group rank == grid index; anything else is a bug in the math above.
  PDSERVE_CHECK(g->tp_.size() == plan.tp && g->tp_.rank() == c.tp, "tp group layout");
  PDSERVE_CHECK(g->cp_.size() == plan.cp && g->cp_.rank() == c.cp, "cp group layout");
  PDSERVE_CHECK(g->dp_.size() == plan.dp && g->dp_.rank() == c.dp, "dp group layout");
  PDSERVE_CHECK(g->ep_.size() == plan.ep && g->ep_.rank() == c.ep, "ep group layout");

  if (c.world == 0) Log()->info("{}: process groups ready: {}", RankTag(), plan.ToString());
  Log()->debug("{}: {}", RankTag(), g->Describe());
  return g;
}

std::string ProcessGroups::Describe() const {
  return fmt::format("world {}/{} cp {}/{} dp {}/{} tp {}/{} ep {}/{} (group {})", coords_.world,
                     world_.size(), coords_.cp, plan_.cp, coords_.dp, plan_.dp, coords_.tp, plan_.tp,
                     coords_.ep, plan_.ep, coords_.ep_group);
}

}  // namespace pdserve::comm
