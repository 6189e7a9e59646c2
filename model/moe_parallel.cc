// The MoE of one layer over the EP group (member of Model), on every rank of the group, also
// with zero rows (a DP dummy step):
//
//   route every row this rank holds -> per (row group, expert) counts (summed over the CP group
//   in a CP prefill: the prompt's group spans it) -> the GEMM path of every (row, slot)
//   -> dispatch this rank's share of the rows (bf16 hidden + slot words) to the expert owners
//   -> shared expert gate/up on those rows while the dispatch is in flight
//   -> local experts on the received rows, grouped by expert, each row on the path its group
//      would take in one process -> combine (fp32 partial sums, summed in EP-rank order)
//   -> shared expert down projection while the combine is in flight
//   -> + shared expert, bf16 -> all-gather the shares over the replicas.
//
// Rounding: identical to Model::Ffn except that a token whose experts live on several EP ranks
// sums its routed outputs per rank first ((a+b)+(c+d) instead of ((a+b)+c)+d), as the reference
// does with its all-reduce over expert-parallel ranks.
#include <algorithm>
#include <cstring>

#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "model/batch_plan.h"
#include "model/model.h"
#include "model/parallel.h"
#include "model/profile_ops.h"

namespace pdserve::model {

Status Model::FfnParallel(int64_t layer, const float* x, const BatchPlan& plan, const ParallelStep& step,
                          float* out) const {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layer(layer);
  const ParallelContext& ctx = *parallel_;
  comm::EpDispatcher& ep = *ctx.ep();
  const int64_t D = c.hidden_size, S = plan.n_rows, top_k = c.num_experts_per_tok;

  // 1. Routing of every row held here (replicas route identically; the router is E outputs).
  std::vector<int32_t> ids(static_cast<size_t>(S * top_k));
  std::vector<float> weights(static_cast<size_t>(S * top_k));
  OpScope op_scope(kOpGate);
  if (S > 0) Route(lw, x, S, ids.data(), weights.data());
  op_scope.Switch(kOpRoutedExperts);

  // 2. This rank's share of the rows, packed as bf16 hidden states.
  comm::TensorParallel* replicas = step.replicas;
  const auto [rb, re] = replicas ? ReplicaRowRange(plan, replicas->size(), replicas->rank())
                                 : std::pair<int64_t, int64_t>{0, S};
  const int64_t n = re - rb, row_bytes = ctx.dispatch_row_bytes();
  std::vector<uint8_t> send(static_cast<size_t>(n * row_bytes));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = rb + i;
    uint8_t* row = &send[static_cast<size_t>(i * row_bytes)];
    uint16_t* h = reinterpret_cast<uint16_t*>(row);
    for (int64_t d = 0; d < D; ++d) h[d] = F32ToBf16Bits(x[t * D + d]);  // x is bf16-valued: exact
  }
  // The shared expert on this rank's rows, in two halves (MlpUp, MlpDown) computed while the
  // dispatch and then the combine are in flight (ParallelContext::ep_overlap), calling
  // Progress() after every chunk: Open MPI advances a non-blocking collective only inside MPI
  // calls. Without the overlap the whole expert runs here, before the dispatch.
  // (progress() is called between the halves and after each; the halves are one GEMM call
  // each, so a long dispatch may advance less often than it could.)
  const bool shared = c.n_shared_experts > 0 && n > 0, overlap = ctx.ep_overlap();
  const int64_t I_sh = shared ? lw.shared.gate.n_out() : 0;
  std::vector<float> z(static_cast<size_t>(n * D), 0.0f), h_sh(static_cast<size_t>(n * I_sh));
  Status progress_status;
  auto progress = [&]() {
    if (!overlap || !progress_status.ok()) return;
    CommTimer timer(&ctx);
    progress_status = ep.Progress().status();
  };
  auto shared_up = [&]() {
    op_scope.Switch(kOpSharedExpert);
    MlpUp(lw.shared, x + rb * D, n, h_sh.data());
    progress();
  };
  auto shared_down = [&]() {
    op_scope.Switch(kOpSharedExpert);
    MlpDown(lw.shared, h_sh.data(), n, z.data());
    progress();
  };
  if (shared && !overlap) {
    shared_up();
    shared_down();
  }
  {
    CommTimer timer(&ctx);
    PDSERVE_RETURN_IF_ERROR(ep.StartDispatch(send.data(), n,
                                             {ids.data() + rb * top_k, static_cast<size_t>(n * top_k)},
                                             {weights.data() + rb * top_k, static_cast<size_t>(n * top_k)}));
  }

  // 4. The shared expert's first half while the dispatch is in flight.
  if (shared && overlap) shared_up();
  PDSERVE_RETURN_IF_ERROR(progress_status);

  // 5. Local experts over the received rows, ascending expert id, weighted sums per row.
  op_scope.Switch(kOpRoutedExperts);
  const comm::EpReceived* in = nullptr;
  {
    CommTimer timer(&ctx);
    PDSERVE_ASSIGN_OR_RETURN(in, ep.WaitDispatch());
  }
  std::vector<float> expert_out(static_cast<size_t>(in->rows * D), 0.0f);
  // Every local expert's received rows in one buffer (bf16 on the wire: exact), then all
  // experts at once (RunExperts: grouped INT8 GEMMs for W8A8 experts).
  std::vector<int64_t> first(static_cast<size_t>(in->n_local_experts) + 1, 0);
  for (int e = 0; e < in->n_local_experts; ++e) first[e + 1] = first[e] + static_cast<int64_t>(in->ExpertRows(e).size());
  std::vector<float> xin(static_cast<size_t>(first.back() * D)), yout(xin.size());
  std::vector<ExpertJob> jobs;
  for (int e = 0; e < in->n_local_experts; ++e) {
    const auto rows = in->ExpertRows(e);
    if (rows.empty()) continue;
    if (plan.stats) ++plan.stats->routed_expert_runs;
    const int64_t m = static_cast<int64_t>(rows.size()), r0 = first[e];
    for (int64_t i = 0; i < m; ++i) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(in->hidden + rows[i] * in->row_bytes);
      for (int64_t d = 0; d < D; ++d) xin[(r0 + i) * D + d] = Bf16ToF32(h[d]);
    }
    jobs.push_back({&lw.experts[static_cast<size_t>(in->first_expert + e)], xin.data() + r0 * D, m, yout.data() + r0 * D});
  }
  RunExperts(jobs);
  for (int e = 0; e < in->n_local_experts; ++e) {
    const auto rows = in->ExpertRows(e);
    const auto w = in->ExpertWeights(e);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t d = 0; d < D; ++d)
        expert_out[static_cast<size_t>(rows[i] * D + d)] +=
            yout[static_cast<size_t>((first[e] + static_cast<int64_t>(i)) * D + d)] * w[i];
  }
  std::vector<float> y(static_cast<size_t>(n * D));
  {
    CommTimer timer(&ctx);
    PDSERVE_RETURN_IF_ERROR(ep.StartCombine(expert_out.data()));
  }
  // The shared expert's second half while the combine is in flight.
  if (shared && overlap) shared_down();
  PDSERVE_RETURN_IF_ERROR(progress_status);
  {
    CommTimer timer(&ctx);
    PDSERVE_RETURN_IF_ERROR(ep.WaitCombine(y, /*accumulate=*/false));
  }
  if (S == 0) return Status::Ok();  // a dummy step: nothing of ours to finish

  // 6. y = routed + shared, bf16; then every replica gets every row.
  op_scope.Switch(kOpOther);
  if (shared)
    for (size_t i = 0; i < y.size(); ++i) y[i] += z[i];
  kernels::RoundToBf16InPlace(y.data(), n * D);
  if (!replicas) {
    std::copy(y.begin(), y.end(), out);
    return Status::Ok();
  }
  const int p = replicas->size();
  std::vector<std::pair<int64_t, int64_t>> ranges(static_cast<size_t>(p));
  int64_t max_rows = 0;
  for (int k = 0; k < p; ++k) {
    ranges[k] = ReplicaRowRange(plan, p, k);
    max_rows = std::max(max_rows, ranges[k].second - ranges[k].first);
  }
  y.resize(static_cast<size_t>(max_rows * D), 0.0f);  // equal pieces for the all-gather
  std::vector<float> all(static_cast<size_t>(p * max_rows * D));
  {
    CommTimer timer(&ctx);
    PDSERVE_RETURN_IF_ERROR(replicas->AllGather(y, all));
  }
  for (int k = 0; k < p; ++k)
    std::copy_n(&all[static_cast<size_t>(k * max_rows * D)], (ranges[k].second - ranges[k].first) * D,
                out + ranges[k].first * D);
  return Status::Ok();
}

}  // namespace pdserve::model
