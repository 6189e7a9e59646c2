#include "model/model.h"

#include <cmath>
#include <limits>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rope.h"
#include "model/batch_plan.h"
#include "model/parallel.h"
#include "model/profile_ops.h"

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
  return Load(model_dir, pool, nullptr);
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& model_dir, ThreadPool* pool,
                                           const ParallelContext* parallel) {
  PDSERVE_ASSIGN_OR_RETURN(auto w, ModelWeights::Load(model_dir, parallel ? parallel->load_options() : LoadOptions{}));
  auto m = std::unique_ptr<Model>(new Model(std::move(w), pool));
  m->parallel_ = parallel;
  return m;
}

Status Model::Validate(const BatchSequence& q) const {
  const ModelConfig& c = config();
  const int64_t S = q.n_tokens;
  if (S <= 0) return Status::InvalidArgument("forward needs at least one token");
  for (int64_t i = 0; i < S; ++i)
    if (q.tokens[i] < 0 || q.tokens[i] >= c.vocab_size)
      return Status::InvalidArgument("token id " + std::to_string(q.tokens[i]) + " outside the vocabulary [0, " +
                                     std::to_string(c.vocab_size) + ")", "position " + std::to_string(i));
  const int64_t T = q.start + S;
  if (q.start < 0 || T > c.max_position_embeddings)
    return Status::InvalidArgument("sequence of " + std::to_string(T) + " tokens exceeds max_position_embeddings " +
                                   std::to_string(c.max_position_embeddings));
  const int64_t L = c.num_hidden_layers, K = c.index_topk;
  const std::vector<int32_t>* forced = q.options ? q.options->forced_topk : nullptr;
  if (forced && static_cast<int64_t>(forced->size()) != L * S * K)
    return Status::InvalidArgument("forced top-k has " + std::to_string(forced->size()) +
                                   " entries, expected n_layers*S*index_topk = " + std::to_string(L * S * K));
  if (forced)
    for (int32_t t : *forced)
      if (t < -1 || t >= T) return Status::InvalidArgument("forced top-k position " + std::to_string(t) + " out of range");
  const std::vector<int32_t>* experts = q.options ? q.options->forced_experts : nullptr;
  const int64_t top_k = c.num_experts_per_tok;
  if (experts && static_cast<int64_t>(experts->size()) != L * S * top_k)
    return Status::InvalidArgument("forced experts has " + std::to_string(experts->size()) +
                                   " entries, expected n_layers*S*num_experts_per_tok = " + std::to_string(L * S * top_k));
  if (experts)
    for (int32_t e : *experts)
      if (e < -1 || e >= c.n_routed_experts)
        return Status::InvalidArgument("forced expert id " + std::to_string(e) + " outside [-1, " +
                                       std::to_string(c.n_routed_experts) + ")");
  const std::vector<float>* inputs = q.options ? q.options->forced_layer_inputs : nullptr;
  if (inputs && static_cast<int64_t>(inputs->size()) != (L + 1) * S * c.hidden_size)
    return Status::InvalidArgument("forced layer inputs has " + std::to_string(inputs->size()) +
                                   " entries, expected (n_layers+1)*S*hidden_size = " +
                                   std::to_string((L + 1) * S * c.hidden_size));
  return Status::Ok();
}

Status Model::Forward(const int32_t* tokens, int64_t S, SequenceKvCache* cache, float* logits,
                      const ForwardOptions& opt) const {
  BatchSequence q;
  q.tokens = tokens;
  q.n_tokens = S;
  q.start = cache->n_tokens();
  q.grouping = RowGrouping::kChunk;
  q.logits = logits;
  q.options = &opt;
  PDSERVE_RETURN_IF_ERROR(Validate(q));
  cache->Resize(q.start + S);
  q.kv = cache->Ref();
  return ForwardBatch(std::span<const BatchSequence>(&q, 1));
}

void Model::PlannedLinear(const Linear& w, const float* x, const BatchPlan& plan, float* y) const {
  ApplyLinear(w, x, plan.n_rows, y, pool_);
}

Status Model::ForwardBatch(std::span<const BatchSequence> seqs, BatchStats* stats,
                           const LayerKvDone& on_layer_kv) const {
  for (size_t s = 0; s < seqs.size(); ++s) {
    PDSERVE_RETURN_IF_ERROR(Validate(seqs[s]).WithContext("batch sequence " + std::to_string(s)));
    if (seqs[s].kv.capacity_tokens < seqs[s].start + seqs[s].n_tokens)
      return Status::InvalidArgument("batch sequence " + std::to_string(s) + ": KV capacity " +
                                     std::to_string(seqs[s].kv.capacity_tokens) + " < " +
                                     std::to_string(seqs[s].start + seqs[s].n_tokens) + " tokens");
  }
  BatchPlan plan = BatchPlan::Build(seqs);
  plan.stats = stats;
  ParallelStep step;
  step.ctx = parallel_;
  if (parallel_ && parallel_->plan().ep > 1) step.replicas = parallel_->unit();
  return RunPlan(seqs, plan, step, on_layer_kv);
}

Status Model::RunPlan(std::span<const BatchSequence> seqs, const BatchPlan& plan, const ParallelStep& step,
                      const LayerKvDone& on_layer_kv) const {
  const ModelConfig& c = config();
  BatchStats* stats = plan.stats;
  const int64_t R = plan.n_rows;
  if (stats) stats->rows += R;
  const int64_t L = c.num_hidden_layers, D = c.hidden_size, K = c.index_topk;
  const bool parallel_moe = parallel_ && parallel_->ep() && (parallel_->plan().ep > 1 || step.cp);
  if (R == 0) {
    // DP dummy step: no rows here, but the EP peers may send rows to this rank's experts.
    if (!parallel_moe) return Status::Ok();
    for (int64_t l = 0; l < L; ++l)
      if (weights_->layer(l).is_moe) PDSERVE_RETURN_IF_ERROR(FfnParallel(l, nullptr, plan, step, nullptr));
    return Status::Ok();
  }
  for (const BatchSequence& q : seqs) {
    ForwardTrace* tr = q.options ? q.options->trace : nullptr;
    if (!tr) continue;
    const int64_t S = q.n_tokens, T = q.start + S;
    tr->hidden.assign(static_cast<size_t>((L + 1) * S * D), 0.0f);
    tr->index_scores.assign(static_cast<size_t>(L * S * T), -std::numeric_limits<float>::infinity());
    tr->topk.assign(static_cast<size_t>(L * S * K), -1);
    tr->experts.assign(static_cast<size_t>(L * S * c.num_experts_per_tok), -1);
  }
  auto trace_hidden = [&](int64_t slot, const std::vector<float>& sum) {
    for (int64_t s = 0; s < plan.n_seqs(); ++s) {
      const BatchSequence& q = seqs[s];
      ForwardTrace* tr = q.options ? q.options->trace : nullptr;
      if (!tr) continue;
      for (int64_t r = plan.seq_row[s]; r < plan.seq_row[s + 1]; ++r)  // by position (CP: not all here)
        std::copy_n(sum.begin() + r * D, D, tr->hidden.begin() + (slot * q.n_tokens + plan.row_pos[r] - q.start) * D);
    }
  };

  // residual: bf16 values; sum: the unrounded fp32 residual + branch output; x: normed input.
  std::vector<float> residual(static_cast<size_t>(R * D)), sum(static_cast<size_t>(R * D));
  std::vector<float> x(static_cast<size_t>(R * D)), branch(static_cast<size_t>(R * D));
  // Row r embeds its own position's token (a CP rank's rows are not the first n_tokens).
  auto row_token = [&](int64_t r) {
    const BatchSequence& q = seqs[plan.row_seq[r]];
    return q.tokens[plan.row_pos[r] - q.start];
  };
  if (comm::TensorParallel* tp = parallel_ ? parallel_->tp() : nullptr) {
    std::vector<int32_t> ids(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) ids[r] = row_token(r);
    CommTimer timer(parallel_);
    PDSERVE_RETURN_IF_ERROR(tp->EmbedSharded(ids, c.vocab_size, D,
                                             [&](int64_t row, float* dst) { weights_->EmbedRow(row, dst); }, residual));
  } else {
    for (int64_t r = 0; r < R; ++r) weights_->EmbedRow(row_token(r), &residual[static_cast<size_t>(r * D)]);
  }
  kernels::RoundToBf16InPlace(residual.data(), R * D);
  sum = residual;
  trace_hidden(0, sum);

  auto norm_rows = [&](const std::vector<float>& w, const std::vector<float>& in, std::vector<float>* out) {
    pool_->ParallelFor(R, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float* o = &(*out)[static_cast<size_t>(i * D)];
        kernels::RmsNorm(&in[static_cast<size_t>(i * D)], w.data(), D, kNormEps, o);
        kernels::RoundToBf16InPlace(o, D);
      }
    }, 8);
  };
  auto add_residual = [&]() {  // sum = fp32(branch) + fp32(residual); residual = bf16(sum)
    pool_->ParallelFor(R, [&](int64_t b, int64_t e) {
      for (size_t i = static_cast<size_t>(b * D); i < static_cast<size_t>(e * D); ++i) sum[i] = branch[i] + residual[i];
      std::copy(sum.begin() + b * D, sum.begin() + e * D, residual.begin() + b * D);
      kernels::RoundToBf16InPlace(&residual[static_cast<size_t>(b * D)], (e - b) * D);
    }, 16);
  };

  // ForwardOptions::forced_layer_inputs: the residual stream of layer `slot`'s input replaced
  // (residual is always bf16(sum)).
  auto force_layer_input = [&](int64_t slot) {
    bool forced = false;
    for (int64_t s = 0; s < plan.n_seqs(); ++s) {
      const BatchSequence& q = seqs[s];
      const std::vector<float>* f = q.options ? q.options->forced_layer_inputs : nullptr;
      if (!f) continue;
      for (int64_t r = plan.seq_row[s]; r < plan.seq_row[s + 1]; ++r)
        std::copy_n(f->begin() + (slot * q.n_tokens + plan.row_pos[r] - q.start) * D, D, sum.begin() + r * D);
      forced = true;
    }
    if (!forced) return;
    residual = sum;
    kernels::RoundToBf16InPlace(residual.data(), R * D);
  };

  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& lw = weights_->layer(l);
    force_layer_input(l);
    norm_rows(lw.attn_norm, sum, &x);
    PDSERVE_RETURN_IF_ERROR(Attention(l, x.data(), plan, step, branch.data()));
    // Attention wrote (and, under CP, gathered) this layer's KV records: nothing later in this
    // call changes them.
    if (on_layer_kv) PDSERVE_RETURN_IF_ERROR(on_layer_kv(l));
    add_residual();
    norm_rows(lw.ffn_norm, sum, &x);
    if (lw.is_moe && parallel_moe) {
      PDSERVE_RETURN_IF_ERROR(FfnParallel(l, x.data(), plan, step, branch.data()));
    } else {
      PDSERVE_RETURN_IF_ERROR(Ffn(l, x.data(), plan, step, branch.data()));
    }
    add_residual();
    trace_hidden(l + 1, sum);
  }
  // Final norm of each sequence's last position only, then fp32 logits. Every row is its own
  // group here (a single-sequence call computes one row), so all take the streaming path.
  // In a CP prefill only the rank holding the last position computes them, then broadcasts.
  std::vector<int64_t> want;
  for (int64_t s = 0; s < plan.n_seqs(); ++s)
    if (seqs[s].logits) want.push_back(s);
  if (want.empty()) return Status::Ok();
  const int64_t V = c.vocab_size;
  int cp_root = -1;
  bool compute = true;
  if (step.cp) {
    const int64_t last = seqs[0].start + seqs[0].n_tokens - 1;
    cp_root = step.cp->OwnerOf(last - step.cp_start);
    compute = cp_root == parallel_->coords().cp;
  }
  OpScope op_scope(kOpLmHead);
  if (compute) {
    const int64_t n = static_cast<int64_t>(want.size()), Vl = weights_->lm_head().n_out();
    std::vector<float> last(static_cast<size_t>(n * D)), out(static_cast<size_t>(n * Vl));
    for (int64_t i = 0; i < n; ++i) {
      // The sequence's last position: its last row (in a CP prefill, rank cp_root's last row).
      const int64_t row = plan.seq_row[want[i] + 1] - 1;
      kernels::RmsNorm(&sum[static_cast<size_t>(row * D)], weights_->final_norm().data(), D, kNormEps, &last[i * D]);
    }
    kernels::RoundToBf16InPlace(last.data(), n * D);
    ApplyLinear(weights_->lm_head(), last.data(), n, out.data(), pool_);
    if (comm::TensorParallel* tp = parallel_ ? parallel_->tp() : nullptr) {
      // Vocabulary-sharded lm_head: every TP rank computed its columns; reassemble them.
      std::vector<float> full(static_cast<size_t>(n * V));
      CommTimer timer(parallel_);
      PDSERVE_RETURN_IF_ERROR(tp->GatherColumns(out, n, V, full));
      out.swap(full);
    }
    for (int64_t i = 0; i < n; ++i) std::copy_n(&out[i * V], V, seqs[want[i]].logits);
  }
  if (step.cp) PDSERVE_RETURN_IF_ERROR(parallel_->CpBroadcast(seqs[0].logits, V * 4, cp_root));
  return Status::Ok();
}

}  // namespace pdserve::model
