#include "model/model.h"

#include <cmath>
#include <limits>

#include "kernels/elementwise.h"
#include "kernels/fp8_quant.h"
#include "kernels/rope.h"

namespace pdserve::model {

namespace {
constexpr float kNormEps = 1e-6f;  // hard-coded in the reference for every norm
}  // namespace

Model::Model(std::unique_ptr<ModelWeights> w, ThreadPool* pool) : weights_(std::move(w)), pool_(pool) {
  const ModelConfig& c = weights_->config();
  kernels::YarnParams y;
  y.enabled = c.yarn.enabled;
  y.factor = c.yarn.factor;
  y.original_max_position = static_cast<double>(c.yarn.original_max_position_embeddings);
  y.beta_fast = c.yarn.beta_fast;
  y.beta_slow = c.yarn.beta_slow;
  rope_freqs_ = kernels::RopeFrequencies(c.qk_rope_head_dim, c.rope_theta, y);
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& model_dir, ThreadPool* pool) {
  PDSERVE_ASSIGN_OR_RETURN(auto w, ModelWeights::Load(model_dir));
  return std::unique_ptr<Model>(new Model(std::move(w), pool));
}

Status Model::Forward(const int32_t* tokens, int64_t S, SequenceKvCache* cache, float* logits,
                      const ForwardOptions& opt) const {
  const ModelConfig& c = config();
  if (S <= 0) return Status::InvalidArgument("forward needs at least one token");
  for (int64_t i = 0; i < S; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      return Status::InvalidArgument("token id " + std::to_string(tokens[i]) + " outside the vocabulary [0, " +
                                     std::to_string(c.vocab_size) + ")", "position " + std::to_string(i));
  const int64_t start = cache->n_tokens();
  const int64_t T = start + S;
  if (T > c.max_position_embeddings)
    return Status::InvalidArgument("sequence of " + std::to_string(T) + " tokens exceeds max_position_embeddings " +
                                   std::to_string(c.max_position_embeddings));
  const int64_t L = c.num_hidden_layers, D = c.hidden_size, K = c.index_topk;
  if (opt.forced_topk && static_cast<int64_t>(opt.forced_topk->size()) != L * S * K)
    return Status::InvalidArgument("forced top-k has " + std::to_string(opt.forced_topk->size()) +
                                   " entries, expected n_layers*S*index_topk = " + std::to_string(L * S * K));
  if (opt.forced_topk)
    for (int32_t t : *opt.forced_topk)
      if (t < -1 || t >= T) return Status::InvalidArgument("forced top-k position " + std::to_string(t) + " out of range");
  cache->Resize(T);
  if (opt.trace) {
    opt.trace->hidden.assign(static_cast<size_t>((L + 1) * S * D), 0.0f);
    opt.trace->index_scores.assign(static_cast<size_t>(L * S * T), -std::numeric_limits<float>::infinity());
    opt.trace->topk.assign(static_cast<size_t>(L * S * K), -1);
  }

  // residual: bf16 values; sum: the unrounded fp32 residual + branch output; x: normed input.
  std::vector<float> residual(static_cast<size_t>(S * D)), sum(static_cast<size_t>(S * D));
  std::vector<float> x(static_cast<size_t>(S * D)), branch(static_cast<size_t>(S * D));
  for (int64_t i = 0; i < S; ++i) weights_->EmbedRow(tokens[i], &residual[static_cast<size_t>(i * D)]);
  kernels::RoundToBf16InPlace(residual.data(), S * D);
  sum = residual;
  if (opt.trace) std::copy(sum.begin(), sum.end(), opt.trace->hidden.begin());

  auto norm_rows = [&](const std::vector<float>& w, const std::vector<float>& in, std::vector<float>* out) {
    for (int64_t i = 0; i < S; ++i)
      kernels::RmsNorm(&in[static_cast<size_t>(i * D)], w.data(), D, kNormEps, &(*out)[static_cast<size_t>(i * D)]);
    kernels::RoundToBf16InPlace(out->data(), S * D);
  };
  auto add_residual = [&]() {  // sum = fp32(branch) + fp32(residual); residual = bf16(sum)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = branch[i] + residual[i];
    residual = sum;
    kernels::RoundToBf16InPlace(residual.data(), S * D);
  };

  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& lw = weights_->layer(l);
    norm_rows(lw.attn_norm, sum, &x);
    Attention(l, x.data(), S, start, cache, opt, branch.data());
    add_residual();
    norm_rows(lw.ffn_norm, sum, &x);
    Ffn(l, x.data(), S, branch.data());
    add_residual();
    if (opt.trace)
      std::copy(sum.begin(), sum.end(), opt.trace->hidden.begin() + static_cast<std::ptrdiff_t>((l + 1) * S * D));
  }
  // Final norm of the last position only, then fp32 logits.
  std::vector<float> last(static_cast<size_t>(D));
  kernels::RmsNorm(&sum[static_cast<size_t>((S - 1) * D)], weights_->final_norm().data(), D, kNormEps, last.data());
  kernels::RoundToBf16InPlace(last.data(), D);
  ApplyLinear(weights_->lm_head(), last.data(), 1, logits, pool_);
  return Status::Ok();
}

void Model::Ffn(int64_t layer, const float* x, int64_t S, float* out) const {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layer(layer);
  const int64_t D = c.hidden_size;
  if (!lw.is_moe) {
    Mlp(lw.dense, x, S, out);
    return;
  }
  const int64_t E = c.n_routed_experts, G = c.n_group, per_group = E / G;
  std::vector<float> logits(static_cast<size_t>(S * E));
  ApplyLinear(lw.router, x, S, logits.data(), pool_);
  // Routing per token: sigmoid scores; bias only for the choice; group-limited top-k.
  std::vector<std::vector<std::pair<int64_t, float>>> routes(static_cast<size_t>(S));
  std::vector<float> s(static_cast<size_t>(E)), b(static_cast<size_t>(E)), gscore(static_cast<size_t>(G));
  std::vector<int32_t> gsel(static_cast<size_t>(G)), esel(static_cast<size_t>(E)), scratch(static_cast<size_t>(E));
  for (int64_t t = 0; t < S; ++t) {
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
    std::vector<float> masked(static_cast<size_t>(E), -INFINITY);
    for (int64_t i = 0; i < n_g; ++i)
      for (int64_t e = gsel[i] * per_group; e < (gsel[i] + 1) * per_group; ++e) masked[e] = b[e];
    const int64_t n_e = kernels::TopKIndices(masked.data(), E, c.num_experts_per_tok, esel.data(), scratch.data());
    float denom = 0.0f;
    for (int64_t i = 0; i < n_e; ++i) denom += s[esel[i]];
    auto& r = routes[static_cast<size_t>(t)];
    for (int64_t i = 0; i < n_e; ++i)
      r.push_back({esel[i], s[esel[i]] / denom * static_cast<float>(c.routed_scaling_factor)});
  }
  // Experts in ascending id order; each gets the rows routed to it (possibly none).
  std::vector<float> y(static_cast<size_t>(S * D), 0.0f);
  std::vector<float> xin, yout;
  std::vector<std::pair<int64_t, float>> rows;  // (token, weight)
  for (int64_t e = 0; e < E; ++e) {
    rows.clear();
    for (int64_t t = 0; t < S; ++t)
      for (const auto& [id, w] : routes[static_cast<size_t>(t)])
        if (id == e) rows.push_back({t, w});
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    xin.resize(static_cast<size_t>(n * D));
    yout.resize(static_cast<size_t>(n * D));
    for (int64_t i = 0; i < n; ++i)
      std::copy(x + rows[i].first * D, x + (rows[i].first + 1) * D, xin.begin() + i * D);
    Mlp(lw.experts[static_cast<size_t>(e)], xin.data(), n, yout.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) y[static_cast<size_t>(rows[i].first * D + d)] += yout[static_cast<size_t>(i * D + d)] * rows[i].second;
  }
  if (c.n_shared_experts > 0) {
    std::vector<float> z(static_cast<size_t>(S * D));
    Mlp(lw.shared, x, S, z.data());
    for (size_t i = 0; i < y.size(); ++i) y[i] += z[i];
  }
  std::copy(y.begin(), y.end(), out);
  kernels::RoundToBf16InPlace(out, S * D);
}

void Model::Mlp(const MlpWeights& m, const float* x, int64_t S, float* out) const {
  const int64_t D = m.gate.n_in(), I = m.gate.n_out();
  std::vector<float> g(static_cast<size_t>(S * I)), u(static_cast<size_t>(S * I));
  ApplyLinear(m.gate, x, S, g.data(), pool_);
  ApplyLinear(m.up, x, S, u.data(), pool_);
  kernels::RoundToBf16InPlace(g.data(), S * I);
  kernels::RoundToBf16InPlace(u.data(), S * I);
  kernels::SiluMulBf16(g.data(), u.data(), S * I, g.data());
  ApplyLinear(m.down, g.data(), S, out, pool_);
  kernels::RoundToBf16InPlace(out, S * D);
}

}  // namespace pdserve::model
