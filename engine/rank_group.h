// RankGroup: an Engine's place in a model instance spread over MPI ranks by a parallel plan
// (model/parallel.h, docs/engine.md "Multi-rank instances").
//
// Every DP unit (the cp * tp ranks with one DP index) serves its own requests. Its leader
// (cp 0, tp 0) runs the Engine: scheduling, sampling, events, the KV pool the services hand out.
// The unit's other ranks are followers: they hold their own copy of the pool's memory and
// replay each of the leader's steps (FollowerLoop), because every rank of a unit must make the
// same model call (TP shards o_proj / lm_head / embedding, CP splits a prompt's positions).
// Across units, a comm::DpCoordinator keeps every rank in lock-step: once per step all ranks
// vote their row count, and a unit with nothing to run takes a dummy forward while others
// work (every MoE layer is an EP exchange the whole instance must enter).
//
// One step, on every rank (leader: Engine::Step; follower: FollowerLoop):
//   1. the leader broadcasts the step to its unit: each sequence's new tokens, start, grouping,
//      whether it samples, its block ids; plus the blocks of requests whose KV was imported
//      since the last step (a decode unit's followers need the prefill's KV too: their bytes
//      follow the message), and the leader's stop vote;
//   2. every rank votes {rows, stop, failed} over the world (DpCoordinator::Sync);
//   3. the group decision: stop (every rank voted stop: leave), nothing to run anywhere, a
//      dummy forward (this unit has no rows), or the real forward: Model::ForwardCp for a step
//      that is one whole prompt when cp > 1 (the engine schedules prompts whole and alone then,
//      SchedulerOptions::whole_prompts), Model::ForwardBatch otherwise.
// A failed vote (another rank failed, or MPI) breaks the group for good (broken() is true): the
// process should exit (mpirun then ends the job). A forward that fails on this rank ends the
// whole instance at once (MPI_Abort): its peers may be waiting inside a collective this rank
// left, which no vote can reach.
//
// Ownership: borrows the model (loaded with the ParallelContext this group's ProcessGroups
// belong to), which must outlive the group; owns its communicators, the DP coordinator and, on
// a follower, the follower's KV memory.
// Threading: one thread makes every call (the engine's step thread, or the follower's main
// thread); MPI must allow it (MPI_THREAD_SERIALIZED when that is not the thread that called
// MPI_Init). Create is collective over the instance.
// Errors: Create: InvalidArgument (the leader's layout disagrees with a follower's model),
// MPI failures; steps: kAborted once another rank failed, MPI failures.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/dp_coordinator.h"
#include "comm/mpi_comm.h"
#include "common/status.h"
#include "engine/block_pool.h"
#include "model/batch.h"
#include "model/model.h"

namespace pdserve::engine {

// One sequence of a step as the leader describes it (tokens and block ids are borrowed).
struct GroupSequence {
  std::span<const int32_t> tokens;  // the new tokens (n of them)
  int64_t start = 0;
  model::RowGrouping grouping = model::RowGrouping::kChunk;
  std::span<const int32_t> blocks;  // the sequence's block ids in the pool
  float* logits = nullptr;          // leader: where its logits go (null: no sample)
};

struct GroupStepResult {
  bool stop = false;     // every rank voted stop: the engine leaves its loop
  bool ran = false;      // this rank ran a forward with its unit's rows
  bool dummy = false;    // this rank ran a dummy forward (its unit had no rows)
};

class RankGroup {
 public:
  // Collective over model.parallel()'s instance. `layout`: this rank's KV block layout (the
  // leader's first step sends its pool's size and geometry; a follower allocates the same pool
  // and refuses a geometry that differs from its own layout). REQUIRES: model.parallel() != null.
  static Result<std::unique_ptr<RankGroup>> Create(const model::Model& model, const KvLayout& layout);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  bool leader() const { return unit_.rank() == 0; }
  int dp_rank() const { return dp_rank_; }
  int dp_size() const { return dp_size_; }
  int unit_size() const { return unit_.size(); }
  // Prompts must be scheduled whole and alone (CP prefill).
  bool whole_prompts() const { return cp_ > 1; }
  bool broken() const { return broken_; }

  // Leader: one step over `seqs` (rows of this unit; may be empty), replicating `imported`
  // blocks of `pool` to the followers first. `on_layer` / `stats` go to the model call.
  Result<GroupStepResult> LeaderStep(std::span<const GroupSequence> seqs, std::span<const int32_t> imported,
                                     const BlockPool& pool, bool stop, model::BatchStats* stats,
                                     const model::LayerKvDone& on_layer);
  // Follower: replays the leader's steps until the group stops (Ok) or breaks (the error).
  Status FollowerLoop();

  int64_t steps() const { return coordinator_->steps(); }
  int64_t dummy_steps() const { return dummy_steps_; }

 private:
  RankGroup(const model::Model& model, const KvLayout& layout, comm::MpiComm unit,
            std::unique_ptr<comm::DpCoordinator> coordinator);
  // Leader: sends {blocks, block bytes, block tokens} of `pool`; follower: receives them and
  // allocates its pool.
  Status ExchangeGeometry(const BlockPool* pool);
  // The step message over the unit: the leader's header (kHeaderWords), message_ and *ids go
  // out; a follower's are resized and filled.
  Status BroadcastStep(int64_t* header, std::vector<int32_t>* ids);
  // The bytes of `blocks` of `pool`, from the leader's pool into each follower's.
  Status BroadcastBlocks(const BlockPool& pool, std::span<const int32_t> blocks);
  // Vote, then run what the decision says over `seqs` built against `pool`.
  Result<GroupStepResult> VoteAndRun(std::span<const GroupSequence> seqs, const BlockPool& pool, bool stop,
                                     model::BatchStats* stats, const model::LayerKvDone& on_layer);

  const model::Model& model_;
  comm::MpiComm unit_;
  std::unique_ptr<comm::DpCoordinator> coordinator_;
  int dp_rank_ = 0, dp_size_ = 1, cp_ = 1;
  bool broken_ = false;
  int64_t dummy_steps_ = 0;
  const KvLayout layout_;
  bool geometry_sent_ = false;                // leader: the pool geometry went out
  std::unique_ptr<BlockPool> follower_pool_;  // followers only
  // Scratch of the step message and the model call.
  std::vector<int64_t> message_;
  std::vector<int32_t> ids_;
  std::vector<model::BatchSequence> batch_;
  std::vector<float> follower_logits_;
};

}  // namespace pdserve::engine
