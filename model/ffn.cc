// The FFN of one layer over a batch (members of Model): a dense MLP, or the MoE (sigmoid
// router with group-limited top-k, routed experts in ascending id order, shared experts).
// Every row keeps the GEMM path its row group would select alone (model/batch.h): for a
// routed expert that is decided by how many rows of the same group chose the expert.
#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "model/batch_plan.h"
#include "model/model.h"
#include "model/parallel.h"
#include "model/profile_ops.h"
#include "model/test_hooks.h"

namespace pdserve::model {

void Model::Route(const LayerWeights& lw, const float* x, int64_t S, const uint8_t* tiled, int32_t* ids,
                  float* weights, const std::vector<const int32_t*>* forced) const {
  const ModelConfig& c = config();
  const int64_t D = c.hidden_size, E = c.n_routed_experts, G = c.n_group, per_group = E / G;
  const int64_t top_k = c.num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(S * E));
  ForEachGemmPath(x, D, logits.data(), E, tiled, S,
                  [&](const float* xs, int64_t m, float* ys) { ApplyLinear(lw.router, xs, m, ys, pool_); });
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
  auto mlp_fn = [&](const MlpWeights& m) {
    return [this, &m](const float* xs, int64_t n, float* ys) { Mlp(m, xs, n, ys); };
  };
  if (!lw.is_moe) {
    OpScope op_scope(kOpDenseFfn);
    ForEachGemmPath(x, D, out, D, plan.row_tiled.data(), S, mlp_fn(lw.dense));
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
  Route(lw, x, S, plan.row_tiled.data(), ids.data(), weights.data(), forced.empty() ? nullptr : &forced);
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
  // Every routed expert's rows gathered into one buffer, experts in ascending id order; within
  // an expert the rows on the tiled path first (RunExperts' order), each row's place recorded.
  std::vector<int64_t> first(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) first[e + 1] = first[e] + static_cast<int64_t>(by_expert[static_cast<size_t>(e)].size());
  const int64_t R = first[E];
  const bool shared = c.n_shared_experts > 0;
  // The shared expert's rows follow the routed ones (all S rows, tiled first).
  const int64_t R_all = R + (shared ? S : 0);
  std::vector<float> xin(static_cast<size_t>(R_all * D)), yout(static_cast<size_t>(R_all * D));
  std::vector<uint8_t> tiled(static_cast<size_t>(R_all));
  std::vector<int64_t> place(static_cast<size_t>(R_all));  // gathered row -> its row of x
  std::vector<int64_t> group_count(plan.group_size.size(), 0);
  std::vector<uint8_t> row_tiled(static_cast<size_t>(S));
  std::vector<ExpertJob> jobs;
  auto gather = [&](const MlpWeights* mlp, int64_t r0, const std::vector<int64_t>& rows) {
    const int64_t n = static_cast<int64_t>(rows.size());
    int64_t k = r0;
    for (int pass = 1; pass >= 0; --pass)  // tiled rows, then the others, each in row order
      for (int64_t t : rows)
        if (row_tiled[static_cast<size_t>(t)] == pass) {
          std::copy(x + t * D, x + (t + 1) * D, xin.begin() + k * D);
          tiled[static_cast<size_t>(k)] = static_cast<uint8_t>(pass);
          place[static_cast<size_t>(k)] = t;
          ++k;
        }
    jobs.push_back({mlp, xin.data() + r0 * D, n, tiled.data() + r0, yout.data() + r0 * D});
  };
  std::vector<int64_t> rows;
  for (int64_t e = 0; e < E; ++e) {
    const auto& er = by_expert[static_cast<size_t>(e)];
    if (er.empty()) continue;
    if (plan.stats) ++plan.stats->routed_expert_runs;
    // A row takes the tiled path iff more than kGemmSmallMMax rows of its group chose e.
    for (const auto& rw : er) ++group_count[static_cast<size_t>(plan.row_group[rw.first])];
    rows.clear();
    for (const auto& rw : er) {
      rows.push_back(rw.first);
      row_tiled[static_cast<size_t>(rw.first)] =
          group_count[static_cast<size_t>(plan.row_group[rw.first])] > kernels::kGemmSmallMMax;
    }
    for (const auto& rw : er) group_count[static_cast<size_t>(plan.row_group[rw.first])] = 0;
    gather(&lw.experts[static_cast<size_t>(e)], first[e], rows);
  }
  if (shared) {
    rows.resize(static_cast<size_t>(S));
    for (int64_t t = 0; t < S; ++t) {
      rows[static_cast<size_t>(t)] = t;
      row_tiled[static_cast<size_t>(t)] = plan.row_tiled[static_cast<size_t>(t)];
    }
    gather(&lw.shared, R, rows);
  }
  // Routed experts and the shared expert in one pass.
  RunExperts(jobs);
  // Weighted sums per row, experts in ascending id order (the summation order is fixed), then
  // the shared expert.
  std::vector<float> y(static_cast<size_t>(S * D), 0.0f);
  // In row order within an expert (the order the sums were always taken in): walk each
  // expert's rows as routed and find their gathered places.
  std::vector<int64_t> slot_of(static_cast<size_t>(S), -1);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t k = first[e]; k < first[e + 1]; ++k) slot_of[static_cast<size_t>(place[static_cast<size_t>(k)])] = k;
    for (const auto& rw : by_expert[static_cast<size_t>(e)]) {
      const float* yo = &yout[static_cast<size_t>(slot_of[static_cast<size_t>(rw.first)] * D)];
      float* yr = &y[static_cast<size_t>(rw.first * D)];
      for (int64_t d = 0; d < D; ++d) yr[d] += yo[d] * rw.second;
    }
  }
  if (shared) {
    op_scope.Switch(kOpSharedExpert);
    for (int64_t k = R; k < R_all; ++k) {
      const float* z = &yout[static_cast<size_t>(k * D)];
      float* yr = &y[static_cast<size_t>(place[static_cast<size_t>(k)] * D)];
      for (int64_t d = 0; d < D; ++d) yr[d] += z[d];
    }
  }
  std::copy(y.begin(), y.end(), out);
  kernels::RoundToBf16InPlace(out, S * D);
  return Status::Ok();
}

void Model::RunExperts(std::span<const ExpertJob> jobs) const {
  if (TEST_per_expert_moe()) {
    for (const ExpertJob& j : jobs)
      ForEachGemmPath(j.x, j.mlp->gate.n_in(), j.y, j.mlp->down.n_out(), j.tiled, j.m,
                      [this, &j](const float* xs, int64_t n, float* ys) { Mlp(*j.mlp, xs, n, ys); });
    return;
  }
  // The GEMM calls: per job, its tiled rows (first) in one call, then calls of at most
  // kGemmSmallMMax rows, exactly the calls ForEachGemmPath makes (so every row keeps its path).
  struct Piece {
    size_t job;
    int64_t r0, m;
  };
  std::vector<Piece> pieces;
  for (size_t k = 0; k < jobs.size(); ++k) {
    const ExpertJob& j = jobs[k];
    int64_t n_tiled = 0;
    while (n_tiled < j.m && j.tiled[n_tiled]) ++n_tiled;
    PDSERVE_DCHECK(std::none_of(j.tiled + n_tiled, j.tiled + j.m, [](uint8_t t) { return t != 0; }));
    if (n_tiled > 0) pieces.push_back({k, 0, n_tiled});
    for (int64_t r = n_tiled; r < j.m; r += kernels::kGemmSmallMMax)
      pieces.push_back({k, r, std::min<int64_t>(kernels::kGemmSmallMMax, j.m - r)});
  }
  // Mlp's steps, each over all experts at once: gate and up of every piece in one grouped
  // call (adjacent calls with the same x: INT8 rows are quantized once), the same bf16
  // roundings and SiLU, then every down projection in a second grouped call.
  std::vector<int64_t> h_off(jobs.size() + 1, 0);  // each job's start in g/u, in values
  for (size_t k = 0; k < jobs.size(); ++k) h_off[k + 1] = h_off[k] + jobs[k].m * jobs[k].mlp->gate.n_out();
  std::vector<float> g(static_cast<size_t>(h_off.back())), u(g.size());
  std::vector<LinearCall> calls;
  calls.reserve(2 * pieces.size());
  for (const Piece& p : pieces) {
    const ExpertJob& j = jobs[p.job];
    const int64_t D = j.mlp->gate.n_in(), I = j.mlp->gate.n_out();
    calls.push_back({&j.mlp->gate, j.x + p.r0 * D, p.m, g.data() + h_off[p.job] + p.r0 * I});
    calls.push_back({&j.mlp->up, j.x + p.r0 * D, p.m, u.data() + h_off[p.job] + p.r0 * I});
  }
  ApplyLinearGrouped(calls.data(), static_cast<int64_t>(calls.size()), pool_);
  const int64_t n_h = h_off.back();
  kernels::RoundToBf16InPlace(g.data(), n_h);
  kernels::RoundToBf16InPlace(u.data(), n_h);
  kernels::SiluMulBf16(g.data(), u.data(), n_h, g.data());
  calls.clear();
  for (const Piece& p : pieces) {
    const ExpertJob& j = jobs[p.job];
    const int64_t I = j.mlp->gate.n_out(), D = j.mlp->down.n_out();
    calls.push_back({&j.mlp->down, g.data() + h_off[p.job] + p.r0 * I, p.m, j.y + p.r0 * D});
  }
  ApplyLinearGrouped(calls.data(), static_cast<int64_t>(calls.size()), pool_);
  for (const ExpertJob& j : jobs) kernels::RoundToBf16InPlace(j.y, j.m * j.mlp->down.n_out());
}

void Model::Mlp(const MlpWeights& m, const float* x, int64_t S, float* out) const {
  std::vector<float> h(static_cast<size_t>(S * m.gate.n_out()));
  MlpUp(m, x, S, h.data());
  MlpDown(m, h.data(), S, out);
}

void Model::MlpUp(const MlpWeights& m, const float* x, int64_t S, float* h) const {
  const int64_t I = m.gate.n_out();
  std::vector<float> u(static_cast<size_t>(S * I));
  ApplyLinear(m.gate, x, S, h, pool_);
  ApplyLinear(m.up, x, S, u.data(), pool_);
  kernels::RoundToBf16InPlace(h, S * I);
  kernels::RoundToBf16InPlace(u.data(), S * I);
  kernels::SiluMulBf16(h, u.data(), S * I, h);
}

void Model::MlpDown(const MlpWeights& m, const float* h, int64_t S, float* out) const {
  ApplyLinear(m.down, h, S, out, pool_);
  kernels::RoundToBf16InPlace(out, S * m.down.n_out());
}

}  // namespace pdserve::model
