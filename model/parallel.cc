#include "model/parallel.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include <mpi.h>

#include "comm/mpi_status.h"
#include "kernels/gemm.h"
#include "model/batch_plan.h"
#include "model/profile_ops.h"

namespace pdserve::model {

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

comm::PlanModelDims PlanDimsOf(const ModelConfig& c) {
  return {.n_routed_experts = c.n_routed_experts, .num_attention_heads = c.num_attention_heads,
          .vocab_size = c.vocab_size};
}

ParallelContext::~ParallelContext() = default;

Result<std::unique_ptr<ParallelContext>> ParallelContext::Create(const comm::ProcessGroups& groups,
                                                                 const ModelConfig& c) {
  const comm::ParallelPlan& plan = groups.plan();
  PDSERVE_RETURN_IF_ERROR(plan.Validate(groups.world().size(), PlanDimsOf(c)));
  auto ctx = std::unique_ptr<ParallelContext>(new ParallelContext(groups));
  ctx->dispatch_row_bytes_ = 2 * c.hidden_size;
  if (groups.world().size() == 1) return ctx;
  // Every rank creates the same helpers in the same order (each Create is collective over its
  // group), decided by the plan alone.
  if (c.n_routed_experts > 0) {
    comm::EpDispatcherOptions o;
    o.n_experts = static_cast<int>(c.n_routed_experts);
    o.top_k = static_cast<int>(c.num_experts_per_tok);
    o.hidden = c.hidden_size;
    o.dispatch_dtype = DType::kBF16;  // the MoE input is bf16-rounded: lossless
    o.dispatch_row_bytes = static_cast<size_t>(ctx->dispatch_row_bytes_);
    o.combine_dtype = DType::kF32;    // partial expert sums stay unrounded, as in one process
    PDSERVE_ASSIGN_OR_RETURN(ctx->ep_, comm::EpDispatcher::Create(groups.ep(), o));
  }
  if (plan.tp > 1) {
    PDSERVE_ASSIGN_OR_RETURN(ctx->tp_, comm::TensorParallel::Create(groups.tp()));
  }
  PDSERVE_ASSIGN_OR_RETURN(ctx->unit_comm_, groups.world().Split(groups.coords().dp, groups.coords().world));
  if (ctx->unit_comm_.size() > 1) {
    PDSERVE_ASSIGN_OR_RETURN(ctx->unit_, comm::TensorParallel::Create(ctx->unit_comm_));
  }
  if (plan.cp > 1) {
    PDSERVE_ASSIGN_OR_RETURN(ctx->cp_sum_, comm::TensorParallel::Create(groups.cp()));
    PDSERVE_ASSIGN_OR_RETURN(ctx->cp_bcast_, groups.cp().Dup());
  }
  return ctx;
}

LoadOptions ParallelContext::load_options() const {
  LoadOptions o;
  o.ep_rank = coords().ep;
  o.ep_size = plan().ep;
  o.tp_rank = coords().tp;
  o.tp_size = plan().tp;
  return o;
}

Result<comm::CpRecordGather*> ParallelContext::CpGather(size_t record_bytes) const {
  for (const auto& g : cp_gathers_)
    if (g->record_bytes() == record_bytes) return g.get();
  PDSERVE_ASSIGN_OR_RETURN(auto g, comm::CpRecordGather::Create(groups_.cp(), record_bytes));
  cp_gathers_.push_back(std::move(g));
  return cp_gathers_.back().get();
}

Status ParallelContext::CpBroadcast(void* data, int64_t bytes, int root) const {
  if (bytes > INT_MAX) return Status::InvalidArgument("CP broadcast of " + std::to_string(bytes) + " bytes");
  CommTimer t(this);
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, cp_bcast_.get()),
                              "MPI_Bcast (cp logits)");
  return Status::Ok();
}

std::pair<int64_t, int64_t> ReplicaRowRange(const BatchPlan& plan, int n, int index) {
  const int64_t R = plan.n_rows;
  return {index * R / n, (index + 1) * R / n};
}

CommTimer::CommTimer(const ParallelContext* ctx) : scope_(kOpMpi), ctx_(ctx), start_ns_(ctx ? NowNs() : 0) {}
CommTimer::~CommTimer() {
  if (ctx_) ctx_->AddCommSeconds(static_cast<double>(NowNs() - start_ns_) * 1e-9);
}

}  // namespace pdserve::model
