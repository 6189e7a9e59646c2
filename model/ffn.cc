// The FFN of one layer over a batch (members of Model): a dense MLP, or the MoE (sigmoid
// router with group-limited top-k, routed experts in ascending id order, shared experts).
// Each projection takes all its rows in one GEMM call (a row's numbers do not depend on m).
#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "model/batch_plan.h"
#include "model/model.h"
#include "model/parallel.h"
#include "model/profile_ops.h"
#include "model/step_scratch.h"
#include "model/forward_variants.h"

namespace pdserve::model {

void Model::Route(const LayerWeights& lw, const float* x, int64_t S, int32_t* ids,
                  float* weights, const std::vector<const int32_t*>* forced) const {
  const ModelConfig& c = config();
  const int64_t E = c.n_routed_experts, G = c.n_group, per_group = E / G;
  const int64_t top_k = c.num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(S * E));
  ApplyLinear(lw.router, x, S, logits.data(), pool_);
  std::fill(ids, ids + S * top_k, -1);
  std::fill(weights, weights + S * top_k, 0.0f);
  // Routing per token: sigmoid scores; bias only for the choice; group-limited top-k.
  pool_->ParallelFor(S, [&](int64_t tb, int64_t te) {
    std::vector<float> s(static_cast<size_t>(E)), b(static_cast<size_t>(E)), gscore(static_cast<size_t>(G));
    std::vector<int32_t> gsel(static_cast<size_t>(G)), esel(static_cast<size_t>(E)), scratch(static_cast<size_t>(E));
    std::vector<float> masked(static_cast<size_t>(E));
    for (int64_t t = tb; t < te; ++t) {
      for (int64_t e = 0; e < E; ++e) {
        s[e] = 1.0f / (1.0f + std::exp(-logits[static_cast<size_t>(t * E + e)]));
        b[e] = s[e] + lw.router_bias[static_cast<size_t>(e)];
      }
      for (int64_t g = 0; g < G; ++g) {
        float top1 = -INFINITY, top2 = -INFINITY;
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          if (b[e] > top1) { top2 = top1; top1 = b[e]; }
          else if (b[e] > top2) top2 = b[e];
        }
        gscore[g] = top1 + top2;
      }
      const int64_t n_g = kernels::TopKIndices(gscore.data(), G, c.topk_group, gsel.data(), scratch.data());
      std::fill(masked.begin(), masked.end(), -INFINITY);
      for (int64_t i = 0; i < n_g; ++i)
        for (int64_t e = gsel[i] * per_group; e < (gsel[i] + 1) * per_group; ++e) masked[e] = b[e];
      const int32_t* force = forced ? (*forced)[static_cast<size_t>(t)] : nullptr;
      int64_t n_e = 0;
      if (force) {
        for (int64_t i = 0; i < top_k; ++i)
          if (force[i] >= 0) esel[n_e++] = force[i];
      } else {
        n_e = kernels::TopKIndices(masked.data(), E, top_k, esel.data(), scratch.data());
      }
      float denom = 0.0f;
      for (int64_t i = 0; i < n_e; ++i) denom += s[esel[i]];
      for (int64_t i = 0; i < n_e; ++i) {
        ids[t * top_k + i] = esel[i];
        weights[t * top_k + i] = s[esel[i]] / denom * static_cast<float>(c.routed_scaling_factor);
      }
    }
  }, 8);
}

Status Model::Ffn(int64_t layer, const float* x, const BatchPlan& plan, const ParallelStep& step, float* out) const {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layer(layer);
  const int64_t D = c.hidden_size, S = plan.n_rows;
  if (!lw.is_moe) {
    OpScope op_scope(kOpDenseFfn);
    Mlp(lw.dense, x, S, out);
    return Status::Ok();
  }
  const int64_t E = c.n_routed_experts, top_k = c.num_experts_per_tok;
  std::vector<int32_t> ids(static_cast<size_t>(S * top_k));
  std::vector<float> weights(static_cast<size_t>(S * top_k));
  // Forced expert choices (ForwardOptions::forced_experts) per row, and the trace.
  std::vector<const int32_t*> forced;
  for (int64_t s = 0; s < plan.n_seqs(); ++s) {
    const BatchSequence& sq = plan.seqs[s];
    if (!sq.options || !sq.options->forced_experts) continue;
    forced.resize(static_cast<size_t>(S), nullptr);
    for (int64_t i = 0; i < sq.n_tokens; ++i)
      forced[static_cast<size_t>(plan.seq_row[s] + i)] = sq.options->forced_experts->data() + (layer * sq.n_tokens + i) * top_k;
  }
  OpScope op_scope(kOpGate);
  Route(lw, x, S, ids.data(), weights.data(), forced.empty() ? nullptr : &forced);
  op_scope.Switch(kOpRoutedExperts);
  for (int64_t s = 0; s < plan.n_seqs(); ++s) {
    const BatchSequence& sq = plan.seqs[s];
    if (sq.options && sq.options->trace)
      std::copy_n(ids.begin() + plan.seq_row[s] * top_k, sq.n_tokens * top_k,
                  sq.options->trace->experts.begin() + layer * sq.n_tokens * top_k);
  }
  // Rows per expert, in row order: (row, weight).
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<size_t>(E));
  for (int64_t t = 0; t < S; ++t)
    for (int64_t j = 0; j < top_k; ++j)
      if (ids[t * top_k + j] >= 0) by_expert[static_cast<size_t>(ids[t * top_k + j])].push_back({t, weights[t * top_k + j]});
  // Every routed expert's rows gathered into one buffer, experts in ascending id order, each
  // expert's rows in row order; the shared expert reads x itself. slot_row[i]: the row gathered
  // at slot i. Per row, its slots and weights in ascending expert order (row_slots / row_weights
  // [t * top_k + j] for j < row_n[t]): the order the weighted sum takes.
  std::vector<int64_t> first(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) first[e + 1] = first[e] + static_cast<int64_t>(by_expert[static_cast<size_t>(e)].size());
  const int64_t R = first[E];
  const bool shared = c.n_shared_experts > 0;
  const int64_t R_all = R + (shared ? S : 0);
  std::vector<int64_t> slot_row(static_cast<size_t>(R)), row_slots(static_cast<size_t>(S * top_k));
  std::vector<float> row_weights(static_cast<size_t>(S * top_k));
  std::vector<int32_t> row_n(static_cast<size_t>(S), 0);
  std::vector<ExpertJob> jobs;
  ScratchVector<float> xin(static_cast<size_t>(R * D)), yout(static_cast<size_t>(R_all * D));
  for (int64_t e = 0; e < E; ++e) {
    const auto& er = by_expert[static_cast<size_t>(e)];
    if (er.empty()) continue;
    if (plan.stats) ++plan.stats->routed_expert_runs;
    for (size_t i = 0; i < er.size(); ++i) {
      const int64_t slot = first[e] + static_cast<int64_t>(i), t = er[i].first;
      slot_row[static_cast<size_t>(slot)] = t;
      row_slots[static_cast<size_t>(t * top_k + row_n[t])] = slot;
      row_weights[static_cast<size_t>(t * top_k + row_n[t]++)] = er[i].second;
    }
    jobs.push_back({&lw.experts[static_cast<size_t>(e)], xin.data() + first[e] * D, static_cast<int64_t>(er.size()),
                    yout.data() + first[e] * D});
  }
  pool_->ParallelFor(R, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::copy_n(x + slot_row[i] * D, D, xin.data() + i * D);
  }, 16);
  if (shared) jobs.push_back({&lw.shared, x, S, yout.data() + R * D});
  // Routed experts and the shared expert in one pass.
  RunExperts(jobs);
  // Per row: the weighted sum over its experts in ascending id order from 0 (the summation
  // order is fixed), then the shared expert, then bf16.
  pool_->ParallelFor(S, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* yr = out + t * D;
      std::fill(yr, yr + D, 0.0f);
      for (int32_t j = 0; j < row_n[t]; ++j) {
        const float* yo = yout.data() + row_slots[static_cast<size_t>(t * top_k + j)] * D;
        const float w = row_weights[static_cast<size_t>(t * top_k + j)];
        for (int64_t d = 0; d < D; ++d) yr[d] += yo[d] * w;
      }
      if (shared) {
        const float* z = yout.data() + (R + t) * D;
        for (int64_t d = 0; d < D; ++d) yr[d] += z[d];
      }
      kernels::RoundToBf16InPlace(yr, D);
    }
  }, 8);
  return Status::Ok();
}

void Model::RunExperts(std::span<const ExpertJob> jobs) const {
  if (per_expert_moe_variant()) {
    for (const ExpertJob& j : jobs) Mlp(*j.mlp, j.x, j.m, j.y);
    return;
  }
  // Mlp's steps, each over all experts at once: gate and up of every job in one grouped call
  // (adjacent calls with the same x: INT8 rows are quantized once), the same bf16 roundings
  // and SiLU, then every down projection in a second grouped call.
  std::vector<int64_t> h_off(jobs.size() + 1, 0);  // each job's start in g/u, in values
  for (size_t k = 0; k < jobs.size(); ++k) h_off[k + 1] = h_off[k] + jobs[k].m * jobs[k].mlp->gate.n_out();
  ScratchVector<float> g(static_cast<size_t>(h_off.back())), u(g.size());
  std::vector<LinearCall> calls;
  calls.reserve(2 * jobs.size());
  for (size_t k = 0; k < jobs.size(); ++k) {
    const ExpertJob& j = jobs[k];
    calls.push_back({&j.mlp->gate, j.x, j.m, g.data() + h_off[k]});
    calls.push_back({&j.mlp->up, j.x, j.m, u.data() + h_off[k]});
  }
  ApplyLinearGrouped(calls.data(), static_cast<int64_t>(calls.size()), pool_);
  const int64_t n_h = h_off.back();
  GateUpToBf16Activation(g.data(), u.data(), n_h, pool_);
  calls.clear();
  for (size_t k = 0; k < jobs.size(); ++k) calls.push_back({&jobs[k].mlp->down, g.data() + h_off[k], jobs[k].m, jobs[k].y});
  ApplyLinearGrouped(calls.data(), static_cast<int64_t>(calls.size()), pool_);
  // Every output row rounded, the jobs' rows in one parallel region.
  std::vector<std::pair<float*, int64_t>> out_rows;  // (row, width)
  for (const ExpertJob& j : jobs)
    for (int64_t i = 0; i < j.m; ++i) out_rows.push_back({j.y + i * j.mlp->down.n_out(), j.mlp->down.n_out()});
  pool_->ParallelFor(static_cast<int64_t>(out_rows.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) kernels::RoundToBf16InPlace(out_rows[i].first, out_rows[i].second);
  }, 16);
}

void Model::Mlp(const MlpWeights& m, const float* x, int64_t S, float* out) const {
  ScratchVector<float> h(static_cast<size_t>(S * m.gate.n_out()));
  MlpUp(m, x, S, h.data());
  MlpDown(m, h.data(), S, out);
}

void Model::MlpUp(const MlpWeights& m, const float* x, int64_t S, float* h) const {
  const int64_t I = m.gate.n_out();
  ScratchVector<float> u(static_cast<size_t>(S * I));
  ApplyLinear(m.gate, x, S, h, pool_);
  ApplyLinear(m.up, x, S, u.data(), pool_);
  GateUpToBf16Activation(h, u.data(), S * I, pool_);
}

void Model::MlpDown(const MlpWeights& m, const float* h, int64_t S, float* out) const {
  ApplyLinear(m.down, h, S, out, pool_);
  RoundToBf16InPlace(out, S * m.down.n_out(), pool_);
}

}  // namespace pdserve::model
