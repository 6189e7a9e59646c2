// Context-parallel prefill (members of Model): the CP ranks of a unit split one prompt with the
// zig-zag comm::CpSplit, run every layer on their own positions, and all-gather each layer's
// new KV records before the indexer scores them, so every query sees its full causal context
// and every rank ends with the whole prompt's KV (for the decode that follows).
//
// A prompt's rest after a cached prefix (RowGrouping::kPromptRest, start > 0; every rank's cache
// holds the prefix, written by the CP prefill that computed it) splits only the new positions;
// the keys to expand are still all of [0, start + n), shared out as a whole prompt's would be.
//
// Bitwise contract: the GEMMs' per-row results do not depend on how many rows share a call
// (docs/kernels-gemm.md), so a rank's rows, and the expanded keys of the reference prefill
// attention computed from the gathered latents, are what one process computes; a CP prefill
// equals the single-process one except for the order of the EP partial sums (and the TP
// o_proj sums when tp > 1). A prompt that would leave a rank 8 rows or fewer runs replicated
// (ForwardBatch on every CP rank): the weight passes would cost more than the split saves.
#include <cstring>

#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/mla_attention.h"
#include "model/batch_plan.h"
#include "model/model.h"
#include "model/parallel.h"

namespace pdserve::model {

Status Model::ForwardCp(const int32_t* tokens, int64_t S, SequenceKvCache* cache, float* logits,
                        ForwardTrace* trace) const {
  if (cache->n_tokens() != 0) return Status::InvalidArgument("ForwardCp needs an empty cache (a whole prompt)");
  BatchSequence q;
  q.tokens = tokens;
  q.n_tokens = S;
  q.start = 0;
  q.grouping = RowGrouping::kChunk;
  q.logits = logits;
  ForwardOptions options;
  options.trace = trace;
  if (trace) q.options = &options;
  PDSERVE_RETURN_IF_ERROR(Validate(q));
  cache->Resize(S);
  q.kv = cache->Ref();
  const Status s = ForwardCp(q);
  if (!s.ok()) cache->Resize(0);
  return s;
}

Status Model::ForwardCp(const BatchSequence& seq, const LayerKvDone& on_layer_kv) const {
  const bool whole = seq.grouping == RowGrouping::kChunk && seq.start == 0;
  const bool rest = seq.grouping == RowGrouping::kPromptRest && seq.start > 0 && !(seq.options && seq.options->trace);
  if (!(whole || rest) || (seq.options && seq.options->forced_topk))
    return Status::InvalidArgument(
        "a CP prefill is a whole prompt (start 0, kChunk) or a prompt's rest after a cached prefix (start > 0, "
        "kPromptRest, no trace), without forced top-k");
  PDSERVE_RETURN_IF_ERROR(Validate(seq));
  if (seq.kv.capacity_tokens < seq.start + seq.n_tokens)
    return Status::InvalidArgument("KV capacity " + std::to_string(seq.kv.capacity_tokens) + " < " +
                                   std::to_string(seq.start + seq.n_tokens) + " tokens");
  const int cp = parallel_ ? parallel_->plan().cp : 1;
  const comm::CpSplit split(seq.n_tokens, cp);
  // Every rank must hold > 8 rows for the split to pay (decided by S and cp alone, so every
  // CP rank decides the same).
  bool use_cp = cp > 1;
  for (int r = 0; use_cp && r < cp; ++r) use_cp = split.RankTokens(r) > kernels::kGemmSmallMMax;
  if (!use_cp) return ForwardBatch(std::span<const BatchSequence>(&seq, 1), nullptr, on_layer_kv);

  BatchPlan plan;
  plan.seqs = std::span<const BatchSequence>(&seq, 1);
  plan.row_pos = split.RankPositions(parallel_->coords().cp);
  for (int64_t& pos : plan.row_pos) pos += seq.start;
  plan.n_rows = static_cast<int64_t>(plan.row_pos.size());
  plan.seq_row = {0, plan.n_rows};
  plan.row_seq.assign(static_cast<size_t>(plan.n_rows), 0);
  ParallelStep step;
  step.ctx = parallel_;
  step.cp = &split;
  step.cp_start = seq.start;
  // The TP peers of a CP rank hold its rows identically: they share its MoE dispatch.
  if (parallel_->plan().ep > 1) step.replicas = parallel_->tp();
  PDSERVE_RETURN_IF_ERROR(RunPlan(plan.seqs, plan, step, on_layer_kv));
  if (seq.options && seq.options->trace) PDSERVE_RETURN_IF_ERROR(GatherCpTrace(plan, step, seq.options->trace));
  return Status::Ok();
}

Status Model::GatherCpTrace(const BatchPlan& plan, const ParallelStep& step, ForwardTrace* trace) const {
  const ModelConfig& c = config();
  const int64_t L = c.num_hidden_layers, D = c.hidden_size, K = c.index_topk, S = step.cp->seq_len();
  // One record per position: its hidden rows (L+1 x D), index-score rows (L x S), top-k rows
  // (L x K), 4-byte words each; every rank packs its own positions, the gather orders them.
  const int64_t words = (L + 1) * D + L * S + L * K;
  PDSERVE_ASSIGN_OR_RETURN(comm::CpRecordGather * gather, parallel_->CpGather(static_cast<size_t>(words * 4)));
  std::vector<uint32_t> local(static_cast<size_t>(plan.n_rows * words)), all(static_cast<size_t>(S * words));
  auto move_record = [&](int64_t pos, uint32_t* rec, bool to_trace) {
    auto field = [&](void* base, int64_t n) {
      if (to_trace) std::memcpy(base, rec, static_cast<size_t>(n * 4));
      else std::memcpy(rec, base, static_cast<size_t>(n * 4));
      rec += n;
    };
    for (int64_t l = 0; l <= L; ++l) field(&trace->hidden[static_cast<size_t>((l * S + pos) * D)], D);
    for (int64_t l = 0; l < L; ++l) field(&trace->index_scores[static_cast<size_t>((l * S + pos) * S)], S);
    for (int64_t l = 0; l < L; ++l) field(&trace->topk[static_cast<size_t>((l * S + pos) * K)], K);
  };
  for (int64_t r = 0; r < plan.n_rows; ++r) move_record(plan.row_pos[r], &local[static_cast<size_t>(r * words)], false);
  {
    CommTimer timer(parallel_);
    PDSERVE_RETURN_IF_ERROR(gather->AllGather(*step.cp, local.data(), all.data()));
  }
  for (int64_t pos = 0; pos < S; ++pos) move_record(pos, &all[static_cast<size_t>(pos * words)], true);
  return Status::Ok();
}

Status Model::GatherCpRecords(int64_t layer, const BatchPlan& plan, const ParallelStep& step) const {
  const KvSequenceRef& kv = plan.seqs[0].kv;
  const KvLayout& l = *kv.layout;
  int64_t bytes[kNumKvComponents], rec = 0;
  for (int c = 0; c < kNumKvComponents; ++c) {
    bytes[c] = l.ComponentBytesPerToken(static_cast<KvComponent>(c));
    rec += bytes[c];
  }
  PDSERVE_ASSIGN_OR_RETURN(comm::CpRecordGather * gather, parallel_->CpGather(static_cast<size_t>(rec)));
  const int64_t n = plan.n_rows, S = step.cp->seq_len();
  std::vector<uint8_t> local(static_cast<size_t>(n * rec)), all(static_cast<size_t>(S * rec));
  auto copy_record = [&](int64_t pos, uint8_t* record, bool to_cache) {
    for (int c = 0; c < kNumKvComponents; ++c) {
      uint8_t* field = kv.Field(layer, static_cast<KvComponent>(c), pos);
      if (to_cache) std::memcpy(field, record, static_cast<size_t>(bytes[c]));
      else std::memcpy(record, field, static_cast<size_t>(bytes[c]));
      record += bytes[c];
    }
  };
  for (int64_t r = 0; r < n; ++r) copy_record(plan.row_pos[r], &local[static_cast<size_t>(r * rec)], false);
  {
    CommTimer timer(parallel_);
    PDSERVE_RETURN_IF_ERROR(gather->AllGather(*step.cp, local.data(), all.data()));
  }
  for (int64_t pos = 0; pos < S; ++pos) copy_record(step.cp_start + pos, &all[static_cast<size_t>(pos * rec)], true);
  return Status::Ok();
}

Status Model::ExpandCpKeys(int64_t layer, const BatchPlan& plan, const ParallelStep& step,
                           std::vector<float>* kv) const {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layer(layer);
  const int64_t W = lw.kv_b.n_out(), Lkv = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  // The keys are every position [0, T) (a cached prefix's too), split among the CP ranks as a
  // whole prompt of T tokens would be: each expands its share, the gather assembles them all.
  const int64_t T = step.cp_start + step.cp->seq_len();
  const comm::CpSplit keys(T, step.cp->cp_size());
  const std::vector<int64_t> positions = keys.RankPositions(parallel_->coords().cp);
  const auto n = static_cast<int64_t>(positions.size());
  // Own keys' latents -> bf16(c Wkv_b^T): per row what a one-process prefill computes.
  std::vector<int32_t> own(positions.begin(), positions.end());
  std::vector<float> latent(static_cast<size_t>(n * Lkv)), kpe(static_cast<size_t>(n * dr));
  std::vector<float> mine(static_cast<size_t>(n * W));
  kernels::GatherLatent(plan.seqs[0].kv.View(layer), own.data(), n, latent.data(), kpe.data());
  ApplyLinear(lw.kv_b, latent.data(), n, mine.data(), pool_);
  std::vector<uint16_t> local(static_cast<size_t>(n * W)), all(static_cast<size_t>(T * W));
  kernels::RoundToBf16InPlace(mine.data(), n * W);  // the reference's rounding point
  for (size_t i = 0; i < local.size(); ++i) local[i] = F32ToBf16Bits(mine[i]);  // exact now
  PDSERVE_ASSIGN_OR_RETURN(comm::CpRecordGather * gather, parallel_->CpGather(static_cast<size_t>(W * 2)));
  {
    CommTimer timer(parallel_);
    PDSERVE_RETURN_IF_ERROR(gather->AllGather(keys, local.data(), all.data()));
  }
  kv->resize(static_cast<size_t>(T * W));
  for (size_t i = 0; i < all.size(); ++i) (*kv)[i] = Bf16ToF32(all[i]);
  return Status::Ok();
}

}  // namespace pdserve::model
