#include "services/worker/model_instance.h"

#include <mpi.h>

#include "common/logging.h"
#include "engine/engine.h"

namespace pdserve::services::worker {

ModelInstance::~ModelInstance() = default;

Result<std::unique_ptr<ModelInstance>> ModelInstance::Load(const WorkerServiceConfig& config, int* argc, char*** argv) {
  std::unique_ptr<ModelInstance> in(new ModelInstance());
  const int threads = config.threads > 0 ? config.threads : ThreadPool::Default().n_threads();
  if (!config.plan) {
    in->pool_ = std::make_unique<ThreadPool>(threads);
    PDSERVE_ASSIGN_OR_RETURN(in->model_, model::Model::Load(config.model_dir, in->pool_.get()));
    return in;
  }
  PDSERVE_ASSIGN_OR_RETURN(in->mpi_, comm::MpiEnvironment::Init(argc, argv, MPI_THREAD_SERIALIZED));
  PDSERVE_ASSIGN_OR_RETURN(in->parallel_, model::LoadParallelInstance(config.model_dir, *config.plan, threads));
  const engine::EngineOptions defaults;
  const KvLayout layout = model::KvLayoutFor(in->parallel_.model->config(), config.block_tokens,
                                                              defaults.latent_format, defaults.index_format);
  PDSERVE_ASSIGN_OR_RETURN(in->group_, engine::RankGroup::Create(*in->parallel_.model, layout));
  return in;
}

std::string ModelInstance::Describe() const { return group_ ? parallel_.groups->Describe() : "one process"; }

Status ModelInstance::RunFollower() {
  if (serves()) return Status::FailedPrecondition("RunFollower on a rank that serves");
  return group_->FollowerLoop();
}

WorkerServiceConfig ForDpRank(const WorkerServiceConfig& config, int dp_rank, int dp_size) {
  WorkerServiceConfig c = config;
  if (dp_size <= 1) return c;
  const std::string suffix = "dp" + std::to_string(dp_rank);
  c.worker_id += "-" + suffix;
  if (!c.ready_file.empty()) c.ready_file += "." + suffix;
  if (c.metrics_port != 0) c.metrics_port += dp_rank;
  return c;
}

}  // namespace pdserve::services::worker
