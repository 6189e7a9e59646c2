#include "engine/rank_group.h"

#include <mpi.h>

#include <string>

#include "comm/mpi_status.h"
#include "common/logging.h"
#include "model/parallel.h"

namespace pdserve::engine {

namespace {

// Step message: a fixed header, then per-sequence metadata (int64) and ids (int32: every
// sequence's tokens, then every sequence's block ids, then the imported block ids).
enum Header : size_t { kStop, kSeqs, kImported, kTokens, kBlockIds, kHeaderWords };
enum SeqWord : size_t { kN, kStart, kGrouping, kSamples, kBlocks, kSeqWords };

}  // namespace

RankGroup::RankGroup(const model::Model& model, const KvLayout& layout, comm::MpiComm unit,
                     std::unique_ptr<comm::DpCoordinator> coordinator)
    : model_(model), unit_(std::move(unit)), coordinator_(std::move(coordinator)), layout_(layout) {}

RankGroup::~RankGroup() = default;

Result<std::unique_ptr<RankGroup>> RankGroup::Create(const model::Model& model, const KvLayout& layout) {
  const model::ParallelContext* ctx = model.parallel();
  if (!ctx) return Status::InvalidArgument("RankGroup needs a model loaded with a ParallelContext");
  const comm::ProcessGroups& groups = ctx->groups();
  PDSERVE_ASSIGN_OR_RETURN(comm::MpiComm unit, groups.world().Split(groups.coords().dp, groups.coords().world));
  PDSERVE_ASSIGN_OR_RETURN(auto coordinator, comm::DpCoordinator::Create(groups.world()));
  std::unique_ptr<RankGroup> g(new RankGroup(model, layout, std::move(unit), std::move(coordinator)));
  g->dp_rank_ = groups.coords().dp;
  g->dp_size_ = groups.plan().dp;
  g->cp_ = groups.plan().cp;
  return g;
}

Status RankGroup::ExchangeGeometry(const BlockPool* pool) {
  int64_t geometry[3] = {pool ? pool->n_blocks() : 0, static_cast<int64_t>(layout_.BlockBytes()), layout_.tokens_per_block};
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Bcast(geometry, 3, MPI_INT64_T, 0, unit_.get()), "MPI_Bcast (pool geometry)");
  if (leader()) return Status::Ok();
  // Followers computed their layout the same way; a mismatch means the ranks were started
  // with different KV settings.
  if (geometry[1] != static_cast<int64_t>(layout_.BlockBytes()) || geometry[2] != layout_.tokens_per_block)
    return Status::InvalidArgument("DP unit " + std::to_string(dp_rank_) + ": the leader's KV blocks are " +
                                   std::to_string(geometry[1]) + " bytes of " + std::to_string(geometry[2]) +
                                   " tokens, this rank's " + std::to_string(layout_.BlockBytes()) + " of " +
                                   std::to_string(layout_.tokens_per_block) + " (start every rank with the same KV settings)");
  PDSERVE_ASSIGN_OR_RETURN(follower_pool_, BlockPool::Create(layout_, geometry[0] * geometry[1]));
  return Status::Ok();
}

Result<GroupStepResult> RankGroup::LeaderStep(std::span<const GroupSequence> seqs, std::span<const int32_t> imported,
                                              const BlockPool& pool, bool stop, model::BatchStats* stats,
                                              const model::LayerKvDone& on_layer) {
  if (broken_) return Status::Aborted("the rank group is broken (a rank failed)");
  if (unit_.size() > 1) {
    if (!geometry_sent_) {
      PDSERVE_RETURN_IF_ERROR(ExchangeGeometry(&pool));
      geometry_sent_ = true;
    }
    int64_t header[kHeaderWords] = {stop ? 1 : 0, static_cast<int64_t>(seqs.size()),
                                    static_cast<int64_t>(imported.size()), 0, 0};
    message_.clear();
    std::vector<int32_t>& ids = ids_;
    ids.clear();
    for (const GroupSequence& s : seqs) {
      message_.insert(message_.end(), {static_cast<int64_t>(s.tokens.size()), s.start, static_cast<int64_t>(s.grouping),
                                       s.logits ? 1 : 0, static_cast<int64_t>(s.blocks.size())});
      ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
      header[kTokens] += static_cast<int64_t>(s.tokens.size());
    }
    for (const GroupSequence& s : seqs) {
      ids.insert(ids.end(), s.blocks.begin(), s.blocks.end());
      header[kBlockIds] += static_cast<int64_t>(s.blocks.size());
    }
    ids.insert(ids.end(), imported.begin(), imported.end());
    PDSERVE_RETURN_IF_ERROR(BroadcastStep(header, &ids));
    PDSERVE_RETURN_IF_ERROR(BroadcastBlocks(pool, imported));
  }
  return VoteAndRun(seqs, pool, stop, stats, on_layer);
}

Status RankGroup::BroadcastStep(int64_t* header, std::vector<int32_t>* ids) {
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Bcast(header, kHeaderWords, MPI_INT64_T, 0, unit_.get()), "MPI_Bcast (step header)");
  if (!leader()) {
    message_.resize(static_cast<size_t>(header[kSeqs]) * kSeqWords);
    ids->resize(static_cast<size_t>(header[kTokens] + header[kBlockIds] + header[kImported]));
  }
  if (!message_.empty())
    PDSERVE_MPI_RETURN_IF_ERROR(MPI_Bcast(message_.data(), static_cast<int>(message_.size()), MPI_INT64_T, 0, unit_.get()),
                                "MPI_Bcast (step sequences)");
  if (!ids->empty())
    PDSERVE_MPI_RETURN_IF_ERROR(MPI_Bcast(ids->data(), static_cast<int>(ids->size()), MPI_INT32_T, 0, unit_.get()),
                                "MPI_Bcast (step ids)");
  return Status::Ok();
}

Status RankGroup::BroadcastBlocks(const BlockPool& pool, std::span<const int32_t> blocks) {
  for (int32_t b : blocks)
    PDSERVE_MPI_RETURN_IF_ERROR(MPI_Bcast(pool.base() + int64_t{b} * pool.block_bytes(),
                                          static_cast<int>(pool.block_bytes()), MPI_BYTE, 0, unit_.get()),
                                "MPI_Bcast (imported KV block)");
  return Status::Ok();
}

Status RankGroup::FollowerLoop() {
  if (leader()) return Status::FailedPrecondition("FollowerLoop on a unit leader");
  PDSERVE_RETURN_IF_ERROR(ExchangeGeometry(nullptr));
  BlockPool& pool = *follower_pool_;
  std::vector<int32_t>& ids = ids_;
  std::vector<GroupSequence> seqs;
  while (true) {
    if (broken_) return Status::Aborted("the rank group is broken (a rank failed)");
    int64_t header[kHeaderWords];
    PDSERVE_RETURN_IF_ERROR(BroadcastStep(header, &ids));
    const auto n_seqs = static_cast<size_t>(header[kSeqs]);
    const std::span<const int32_t> imported(ids.data() + header[kTokens] + header[kBlockIds],
                                            static_cast<size_t>(header[kImported]));
    for (int32_t b : imported)
      if (b < 0 || b >= pool.n_blocks()) return Status::Internal("imported block id " + std::to_string(b) + " outside the pool");
    PDSERVE_RETURN_IF_ERROR(BroadcastBlocks(pool, imported));
    seqs.assign(n_seqs, {});
    follower_logits_.resize(n_seqs * static_cast<size_t>(model_.config().vocab_size));
    const int32_t* tokens = ids.data();
    const int32_t* blocks = ids.data() + header[kTokens];
    for (size_t i = 0; i < n_seqs; ++i) {
      const int64_t* w = &message_[i * kSeqWords];
      GroupSequence& s = seqs[i];
      s.tokens = {tokens, static_cast<size_t>(w[kN])};
      s.start = w[kStart];
      s.grouping = static_cast<model::RowGrouping>(w[kGrouping]);
      s.blocks = {blocks, static_cast<size_t>(w[kBlocks])};
      for (int32_t b : s.blocks)
        if (b < 0 || b >= pool.n_blocks()) return Status::Internal("block id " + std::to_string(b) + " outside the pool");
      if (w[kSamples]) s.logits = &follower_logits_[i * static_cast<size_t>(model_.config().vocab_size)];
      tokens += w[kN];
      blocks += w[kBlocks];
    }
    PDSERVE_ASSIGN_OR_RETURN(GroupStepResult r, VoteAndRun(seqs, pool, header[kStop] != 0, nullptr, {}));
    if (r.stop) return Status::Ok();
  }
}

Result<GroupStepResult> RankGroup::VoteAndRun(std::span<const GroupSequence> seqs, const BlockPool& pool, bool stop,
                                              model::BatchStats* stats, const model::LayerKvDone& on_layer) {
  batch_.clear();
  int64_t rows = 0;
  for (const GroupSequence& s : seqs) {
    model::BatchSequence b;
    b.tokens = s.tokens.data();
    b.n_tokens = static_cast<int64_t>(s.tokens.size());
    b.start = s.start;
    b.kv.pool_base = pool.base();
    b.kv.layout = &pool.layout();
    b.kv.block_table = s.blocks.data();
    b.kv.capacity_tokens = static_cast<int64_t>(s.blocks.size()) * pool.layout().tokens_per_block;
    b.grouping = s.grouping;
    b.logits = s.logits;
    batch_.push_back(b);
    rows += b.n_tokens;
  }
  // A step that is one whole prompt is a CP prefill when the unit spans CP ranks (the leader's
  // scheduler makes such steps alone; every unit rank decides the same from the same message).
  const bool cp_prefill =
      cp_ > 1 && batch_.size() == 1 &&
      ((batch_[0].start == 0 && batch_[0].grouping == model::RowGrouping::kChunk) ||
       batch_[0].grouping == model::RowGrouping::kPromptRest);
  GroupStepResult result;
  auto forward = [&](const comm::DpDecision&) {
    result.ran = true;
    return cp_prefill ? model_.ForwardCp(batch_[0], on_layer) : model_.ForwardBatch(batch_, stats, on_layer);
  };
  auto dummy = [&](const comm::DpDecision&) {
    result.dummy = true;
    ++dummy_steps_;
    return model_.ForwardBatch({}, nullptr, {});
  };
  comm::DpVote vote;
  vote.tokens = rows;
  vote.stop = stop && rows == 0;
  Result<comm::DpDecision> d = coordinator_->Step(vote, forward, dummy);
  if (!d.ok()) {
    if (result.ran || result.dummy) {
      // This rank's forward failed part-way: its peers may be waiting inside a collective it
      // left, where no vote reaches them. End the whole instance now (mpirun then stops every
      // rank, and the router moves the instance's requests) rather than leave it wedged.
      GetLogger("engine")->critical("DP unit {}: forward failed on a multi-rank instance ({}): aborting the instance",
                                    dp_rank_, d.status().ToString());
      MPI_Abort(model_.parallel()->groups().world().get(), 4);
    }
    // The vote itself failed (kAborted: another rank failed; or MPI): the ranks no longer
    // agree on the step, so the group is done.
    broken_ = true;
    return d.status();
  }
  result.stop = d.value().stop;
  return result;
}

}  // namespace pdserve::engine
