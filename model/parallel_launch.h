// ParallelGenerate: greedy generation of a list of prompts by one model instance spread over
// the MPI world by a parallel plan: the body of `pdserve generate --plan ...` under mpirun.
//
// Every rank builds the process groups (a plan that does not fit the world or the model fails
// here, on every rank, with the reason), loads its share of the model, and runs RunGreedyDp
// (model/parallel_greedy.h): prompt i belongs to DP unit i % dp; a unit with cp > 1 prefills
// each of its prompts with a CP prefill. The outputs are then collected so that every rank
// holds every prompt's tokens, in prompt order (rank 0 prints them). With `dumps`, every rank
// records what an accuracy dump needs (model/greedy_run.h) and each prompt's run is sent from
// its unit's leader (cp 0, tp 0) to world rank 0, which returns them in `runs`: the same shapes
// and layout as the single-process RunGreedy (a CP prefill's trace is gathered over the CP
// ranks first, model.h ForwardCp).
//
// REQUIRES: MPI initialized (comm::MpiEnvironment) with world size cp * dp * tp.
// Errors: kInvalidArgument for a bad plan (every rank), empty prompts or bad ids; load errors;
// kAborted when another rank failed. Threading: the calling thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/parallel_plan.h"
#include "comm/process_groups.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "model/model.h"
#include "model/parallel.h"
#include "model/parallel_greedy.h"

namespace pdserve::model {

struct ParallelGenerateOptions {
  std::string model_dir;
  comm::ParallelPlan plan;
  std::vector<std::vector<int32_t>> prompts;
  int64_t max_new = 16;
  int threads = 1;  // compute threads per rank
  bool dumps = false;
  KvCacheFormats kv;
  bool profile = false;  // fill ParallelGenerateResult::profile_table
};

struct ParallelGenerateResult {
  std::vector<std::vector<int32_t>> outputs;  // per prompt, on every rank
  std::vector<GreedyRun> runs;                // per prompt, world rank 0 only, with `dumps`
  int world_rank = 0;
  std::string describe;                       // this rank's place ("world 1/4 cp 0/1 ...")
  DpRunStats stats;                           // this rank's driver counters
  double comm_seconds = 0;                    // this rank's time inside model collectives
  double load_seconds = 0;
  std::string profile_table;                  // this rank's op profile (options.profile)
  comm::EpOverlap ep_overlap;                 // this rank's EP exchanges (comm/ep_dispatcher.h)
};

Result<ParallelGenerateResult> ParallelGenerate(const ParallelGenerateOptions& options);

// This rank's share of a model instance under `plan`: its process groups, parallel context,
// compute threads and weights (members in construction order; destroyed in reverse). The load
// is agreed on: a rank that cannot load makes every rank fail (kAborted elsewhere) before
// anyone waits in a collective. Collective over MPI_COMM_WORLD (REQUIRES: MPI initialized).
struct ParallelInstance {
  std::unique_ptr<comm::ProcessGroups> groups;
  std::unique_ptr<ParallelContext> context;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Model> model;
};
Result<ParallelInstance> LoadParallelInstance(const std::string& model_dir, const comm::ParallelPlan& plan, int threads);

}  // namespace pdserve::model
