#include "model/parallel_launch.h"

#include <chrono>
#include <climits>
#include <memory>

#include <nlohmann/json.hpp>

#include "comm/dp_coordinator.h"
#include "comm/mpi_comm.h"
#include "comm/mpi_status.h"
#include "comm/process_groups.h"
#include "comm/tensor_parallel.h"
#include "model/parallel.h"
#include "model/profile_ops.h"

namespace pdserve::model {

namespace {

// Moves each prompt's dump data from the leader of its unit to world rank 0 (point to point on
// a duplicate of the world communicator, so no helper's traffic can match it). Both sides know
// every array's size from the config, the prompt length and the output length, so rank 0
// receives into buffers of the right size; a sender whose arrays have other sizes (a bug) still
// sends that many bytes and then fails, so rank 0 never waits for bytes that are not coming.
// `local[i]` is set on prompt i's owner. Collective over the world (the Dup).
Status SendRunsToRankZero(const comm::MpiComm& world_comm, const comm::ParallelPlan& plan, const ModelConfig& c,
                          const std::vector<std::vector<int32_t>>& prompts,
                          const std::vector<std::vector<int32_t>>& outputs, const std::vector<GreedyRun*>& local,
                          std::vector<GreedyRun>* at_root) {
  PDSERVE_ASSIGN_OR_RETURN(comm::MpiComm world, world_comm.Dup());
  const int64_t L = c.num_hidden_layers, D = c.hidden_size, K = c.index_topk, V = c.vocab_size;
  const int me = world.rank();
  if (me == 0) at_root->resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int owner = comm::ProcessGroups::WorldRankOf(plan, 0, static_cast<int>(i % plan.dp), 0);
    if (me != 0 && me != owner) continue;
    const int64_t S = static_cast<int64_t>(prompts[i].size()), steps = static_cast<int64_t>(outputs[i].size());
    if (me == 0 && owner == 0) {
      (*at_root)[i] = std::move(*local[i]);
      continue;
    }
    GreedyRun recv;
    GreedyRun* run = me == 0 ? &recv : local[i];
    if (me == 0) {
      run->prompt = prompts[i];
      run->output = outputs[i];
    }
    struct Field { void* data; size_t bytes; const char* name; };
    std::vector<Field> fields;
    Status mismatch;
    auto add = [&](auto& vec, int64_t n, const char* name) {
      if (me != 0 && static_cast<int64_t>(vec.size()) != n && mismatch.ok())
        mismatch = Status::Internal("dump of prompt " + std::to_string(i) + ": " + name + " holds " +
                                    std::to_string(vec.size()) + " values, expected " + std::to_string(n));
      vec.resize(static_cast<size_t>(n));
      fields.push_back({vec.data(), vec.size() * 4, name});
    };
    add(run->prefill.hidden, (L + 1) * S * D, "hidden");
    add(run->prefill.index_scores, L * S * S, "index_scores");
    add(run->prefill.topk, L * S * K, "topk");
    add(run->step_logits, steps * V, "step_logits");
    add(run->topk_decode, std::max<int64_t>(steps - 1, 0) * L * K, "topk_decode");
    int tag = 0;
    for (const Field& f : fields) {
      // Known on both sides before any message: both refuse together.
      if (f.bytes > static_cast<size_t>(INT_MAX))
        return Status::InvalidArgument(std::string("dump array ") + f.name + " of prompt " + std::to_string(i) +
                                       " exceeds 2 GiB; dump a shorter prompt");
      const int count = static_cast<int>(f.bytes);
      if (me == 0) {
        PDSERVE_MPI_RETURN_IF_ERROR(MPI_Recv(f.data, count, MPI_BYTE, owner, tag, world.get(), MPI_STATUS_IGNORE),
                                    "MPI_Recv (dump to rank 0)");
      } else {
        PDSERVE_MPI_RETURN_IF_ERROR(MPI_Send(f.data, count, MPI_BYTE, 0, tag, world.get()), "MPI_Send (dump to rank 0)");
      }
      ++tag;
    }
    PDSERVE_RETURN_IF_ERROR(mismatch);
    if (me == 0) (*at_root)[i] = std::move(recv);
  }
  return Status::Ok();
}

}  // namespace

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

Result<ParallelGenerateResult> ParallelGenerate(const ParallelGenerateOptions& opt) {
  ParallelGenerateResult result;
  const auto t0 = std::chrono::steady_clock::now();
  PDSERVE_ASSIGN_OR_RETURN(ParallelInstance instance, LoadParallelInstance(opt.model_dir, opt.plan, opt.threads));
  result.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const comm::ProcessGroups* groups = instance.groups.get();
  const ParallelContext* ctx = instance.context.get();
  const Model* model = instance.model.get();
  const ModelConfig& config = model->config();
  result.describe = groups->Describe();
  result.world_rank = groups->coords().world;

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
  DpRunOptions run_options;
  run_options.trace = opt.dumps;
  run_options.kv = opt.kv;
  OpProfile profile = MakeForwardProfile();
  if (opt.profile) run_options.profile = &profile;
  PDSERVE_ASSIGN_OR_RETURN(auto runs,
                           RunGreedyDp(*model, coordinator.get(), mine, max_new, &result.stats, run_options));
  result.comm_seconds = ctx->comm_seconds();
  if (opt.profile) result.profile_table = profile.Table();
  if (ctx->ep() != nullptr) result.ep_overlap = ctx->ep()->overlap();
  PDSERVE_ASSIGN_OR_RETURN(auto all, comm::TensorParallel::Create(groups->world()));

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
  if (opt.dumps) {
    std::vector<GreedyRun*> local(static_cast<size_t>(n), nullptr);
    if (leader)
      for (size_t k = 0; k < runs.size(); ++k) local[mine_index[k]] = &runs[k];
    PDSERVE_RETURN_IF_ERROR(SendRunsToRankZero(groups->world(), opt.plan, config, opt.prompts, result.outputs, local,
                                               &result.runs));
  }
  return result;
}

}  // namespace pdserve::model
