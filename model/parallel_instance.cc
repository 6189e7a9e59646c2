#include "model/parallel_instance.h"

#include <algorithm>
#include <vector>

#include "comm/mpi_comm.h"
#include "comm/tensor_parallel.h"

namespace pdserve::model {

Result<ParallelInstance> LoadParallelInstance(const std::string& model_dir, const comm::ParallelPlan& plan,
                                              int threads) {
  ParallelInstance in;
  PDSERVE_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(model_dir + "/config.json"));
  PDSERVE_ASSIGN_OR_RETURN(comm::MpiComm world, comm::MpiComm::World());
  // Collective: a bad plan fails here on every rank with the reason.
  PDSERVE_ASSIGN_OR_RETURN(in.groups, comm::ProcessGroups::Create(world, plan, PlanDimsOf(config)));
  PDSERVE_ASSIGN_OR_RETURN(in.context, ParallelContext::Create(*in.groups, config));
  in.pool = std::make_unique<ThreadPool>(std::max(1, threads));
  // Load errors (a missing shard on one host) are agreed on before anyone waits in a collective.
  auto model = Model::Load(model_dir, in.pool.get(), in.context.get());
  PDSERVE_ASSIGN_OR_RETURN(auto all, comm::TensorParallel::Create(in.groups->world()));
  std::vector<float> ok_votes(static_cast<size_t>(all->size()));
  const float my_ok = model.ok() ? 1.0f : 0.0f;
  PDSERVE_RETURN_IF_ERROR(all->AllGather({&my_ok, 1}, ok_votes));
  if (!model.ok()) return model.status();
  for (size_t r = 0; r < ok_votes.size(); ++r)
    if (ok_votes[r] == 0.0f) return Status::Aborted("rank " + std::to_string(r) + " failed to load the model");
  in.model = std::move(model).value();
  return in;
}

}  // namespace pdserve::model
