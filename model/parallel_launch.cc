#include "model/parallel_launch.h"

#include <chrono>
#include <memory>

#include <nlohmann/json.hpp>

#include "comm/dp_coordinator.h"
#include "comm/mpi_comm.h"
#include "comm/process_groups.h"
#include "comm/tensor_parallel.h"
#include "model/parallel.h"

namespace pdserve::model {

Result<comm::ParallelPlan> ParsePlanString(const std::string& text) {
  nlohmann::json j = nlohmann::json::object();
  size_t i = 0;
  while (i < text.size()) {
    size_t k = text.find(',', i);
    if (k == std::string::npos) k = text.size();
    const std::string part = text.substr(i, k - i);
    const size_t eq = part.find('=');
    char* end = nullptr;
    const long v = eq == std::string::npos ? 0 : std::strtol(part.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || eq + 1 == part.size() || *end != '\0')
      return Status::InvalidArgument("--plan: '" + part + "' is not key=number (e.g. cp=2,ep=2)");
    j[part.substr(0, eq)] = v;
    i = k + 1;
  }
  return comm::ParallelPlan::FromJson(j, "--plan");
}

Result<ParallelGenerateResult> ParallelGenerate(const ParallelGenerateOptions& opt) {
  ParallelGenerateResult result;
  PDSERVE_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(opt.model_dir + "/config.json"));
  PDSERVE_ASSIGN_OR_RETURN(comm::MpiComm world, comm::MpiComm::World());
  // Collective: a bad plan fails here on every rank with the reason.
  PDSERVE_ASSIGN_OR_RETURN(auto groups, comm::ProcessGroups::Create(world, opt.plan, PlanDimsOf(config)));
  result.describe = groups->Describe();
  result.world_rank = groups->coords().world;
  PDSERVE_ASSIGN_OR_RETURN(auto ctx, ParallelContext::Create(*groups, config));
  ThreadPool pool(std::max(1, opt.threads));
  const auto t0 = std::chrono::steady_clock::now();
  // Load errors (a missing shard on one host) are agreed on before anyone waits in a collective.
  auto model = Model::Load(opt.model_dir, &pool, ctx.get());
  PDSERVE_ASSIGN_OR_RETURN(auto all, comm::TensorParallel::Create(groups->world()));
  std::vector<float> ok_votes(static_cast<size_t>(all->size()));
  const float my_ok = model.ok() ? 1.0f : 0.0f;
  PDSERVE_RETURN_IF_ERROR(all->AllGather({&my_ok, 1}, ok_votes));
  if (!model.ok()) return model.status();
  for (size_t r = 0; r < ok_votes.size(); ++r)
    if (ok_votes[r] == 0.0f) return Status::Aborted("rank " + std::to_string(r) + " failed to load the model");
  result.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const int dp = opt.plan.dp, unit = groups->coords().dp;
  std::vector<std::vector<int32_t>> mine;
  std::vector<int64_t> max_new;
  std::vector<size_t> mine_index;
  for (size_t i = 0; i < opt.prompts.size(); ++i)
    if (static_cast<int>(i % dp) == unit) {
      mine.push_back(opt.prompts[i]);
      max_new.push_back(opt.max_new);
      mine_index.push_back(i);
    }
  PDSERVE_ASSIGN_OR_RETURN(auto coordinator, comm::DpCoordinator::Create(groups->world()));
  PDSERVE_ASSIGN_OR_RETURN(auto runs, RunGreedyDp(**model, coordinator.get(), mine, max_new, &result.stats));
  result.comm_seconds = ctx->comm_seconds();

  // Every rank contributes a fixed-size block: its unit's outputs (ids as exact floats) when it
  // leads the unit (cp 0, tp 0), -1 elsewhere; the prompt's owner unit's leader block wins.
  const int64_t n = static_cast<int64_t>(opt.prompts.size()), M = opt.max_new;
  std::vector<float> block(static_cast<size_t>(n * M), -1.0f), gathered(static_cast<size_t>(all->size() * n * M));
  const bool leader = groups->coords().cp == 0 && groups->coords().tp == 0;
  if (leader)
    for (size_t k = 0; k < runs.size(); ++k)
      for (size_t t = 0; t < runs[k].output.size(); ++t)
        block[static_cast<size_t>(mine_index[k] * M) + t] = static_cast<float>(runs[k].output[t]);
  PDSERVE_RETURN_IF_ERROR(all->AllGather(block, gathered));
  result.outputs.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int owner = comm::ProcessGroups::WorldRankOf(opt.plan, 0, static_cast<int>(i % dp), 0);
    for (int64_t t = 0; t < M; ++t)
      result.outputs[i].push_back(static_cast<int32_t>(gathered[static_cast<size_t>((owner * n + i) * M + t)]));
  }
  return result;
}

}  // namespace pdserve::model
