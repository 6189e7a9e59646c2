// ModelInstance: the model a worker process serves (docs/services.md "Multi-rank workers").
//
// Without a plan (worker.plan / --plan empty) it is the one-process model with its own compute
// threads. With one, the process is a rank of a multi-rank instance started by mpirun with
// cp * dp * tp ranks: MPI starts here (MPI_THREAD_SERIALIZED: the engine's step thread makes
// the MPI calls after the main thread loaded the model), every rank loads its share
// (model::LoadParallelInstance) and joins the engine::RankGroup. Each DP unit's leader then
// serves as a worker of its own (one registration per DP rank, ForDpRank), and the other ranks
// of the unit replay their leader's steps (RunFollower) until the instance stops.
//
// Ownership: owns MPI (finalized last), the model and the group.
// Threading: Load and RunFollower on the main thread.
// Errors: Load: a bad plan (InvalidArgument, on every rank), MPI unavailable (Unavailable),
// the model's load errors (or Aborted when another rank failed to load).
#pragma once

#include <memory>
#include <string>

#include "comm/mpi_environment.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/rank_group.h"
#include "model/model.h"
#include "model/parallel_instance.h"
#include "services/worker/worker_config.h"

namespace pdserve::services::worker {

class ModelInstance {
 public:
  static Result<std::unique_ptr<ModelInstance>> Load(const WorkerServiceConfig& config, int* argc, char*** argv);
  ~ModelInstance();
  ModelInstance(const ModelInstance&) = delete;
  ModelInstance& operator=(const ModelInstance&) = delete;

  const model::Model& model() const { return group_ ? *parallel_.model : *model_; }
  engine::RankGroup* group() const { return group_.get(); }
  // This rank runs an engine and registers with the router (false: a follower).
  bool serves() const { return !group_ || group_->leader(); }
  int dp_rank() const { return group_ ? group_->dp_rank() : 0; }
  int dp_size() const { return group_ ? group_->dp_size() : 1; }
  // "one process" or the rank's place ("world 1/4 cp 0/1 dp 1/2 tp 0/1 ep 1/4 (group 0)").
  std::string Describe() const;

  // Follower: replays the leader's steps until the instance stops. REQUIRES: !serves().
  Status RunFollower();

 private:
  ModelInstance() = default;

  // Declaration order = construction order; destroyed in reverse (MPI last).
  std::unique_ptr<comm::MpiEnvironment> mpi_;
  std::unique_ptr<ThreadPool> pool_;      // one process
  std::unique_ptr<model::Model> model_;   // one process
  model::ParallelInstance parallel_;      // multi-rank
  std::unique_ptr<engine::RankGroup> group_;
};

// The identity and endpoints of DP rank `dp_rank` of `dp_size` (the instance's config): with
// dp_size > 1 the worker id becomes "<id>-dp<rank>", the ready file "<file>.dp<rank>" and a fixed
// metrics port "<port> + rank". Unchanged for dp_size 1.
WorkerServiceConfig ForDpRank(const WorkerServiceConfig& config, int dp_rank, int dp_size);

}  // namespace pdserve::services::worker
