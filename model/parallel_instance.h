// ParallelInstance: this rank's share of a model instance under a parallel plan (model/parallel.h,
// docs/parallel.md): its process groups, parallel context, compute threads and weights. Used by
// everything that runs a model over MPI ranks: the multi-rank worker
// (services/worker/model_instance.h), `pdserve generate --plan` (model/tools/parallel_generate.h),
// the engine's rank-group tests.
//
// Ownership: the members, in construction order; destroyed in reverse.
// Threading: LoadParallelInstance on the thread that makes the MPI calls.
#pragma once

#include <memory>
#include <string>

#include "comm/parallel_plan.h"
#include "comm/process_groups.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model.h"
#include "model/parallel.h"

namespace pdserve::model {

struct ParallelInstance {
  std::unique_ptr<comm::ProcessGroups> groups;
  std::unique_ptr<ParallelContext> context;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Model> model;
};

// Builds the process groups (a plan that does not fit the world or the model fails here, on
// every rank, with the reason) and loads this rank's share of the model from `model_dir` with
// `threads` compute threads. The load is agreed on: a rank that cannot load makes every rank
// fail (kAborted elsewhere) before anyone waits in a collective.
// REQUIRES: MPI initialized (comm::MpiEnvironment). Collective over MPI_COMM_WORLD.
// Errors: kInvalidArgument for a bad plan; the model's load errors; kAborted when another rank
// failed to load.
Result<ParallelInstance> LoadParallelInstance(const std::string& model_dir, const comm::ParallelPlan& plan, int threads);

}  // namespace pdserve::model
