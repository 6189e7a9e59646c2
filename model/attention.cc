// MLA attention and the Lightning Indexer of one layer over a batch (members of Model).
// The rounding points follow docs/model-numerics.md step by step; "bf16(...)" below means
// the value is rounded to bf16 there, as the reference does. Per-row arithmetic never depends
// on the other rows of the batch (model/batch.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_quant.h"
#include "kernels/gemm.h"
#include "kernels/indexer.h"
#include "kernels/mla_attention.h"
#include "kernels/rope.h"
#include "model/batch_plan.h"
#include "model/model.h"
#include "model/parallel.h"
#include "model/profile_ops.h"
#include "model/step_scratch.h"
#include "model/forward_variants.h"

namespace pdserve::model {

namespace {
// The indexer's RoPE (half-split pairs) by the position's angles (kernels::RopeAngles), or a
// test's variant (model/forward_variants.h).
void IndexerRope(float* x, int64_t dr, int64_t pos, const float* freqs, const float* cos, const float* sin) {
  if (const RopeFn variant = indexer_rope_variant(); variant != nullptr) [[unlikely]] {
    variant(x, dr, pos, freqs);
    return;
  }
  kernels::ApplyRopeHalfSplit(x, dr, cos, sin);
}

// A row's RoPE angles, computed once for all of its heads and its key (kernels/rope.h).
struct RowAngles {
  float cos[kernels::kRopeMaxDim / 2], sin[kernels::kRopeMaxDim / 2];
};
}  // namespace

namespace {
constexpr float kNormEps = 1e-6f;
constexpr int64_t kIndexerKeysPerTask = 1024;  // keys scored per parallel work item
// Absorbed rows up to which the query absorption runs as a GEMM against W_uk transposed; above
// it AbsorbQueries was faster (16 heads: the GEMM 47 / 140 / 570 us at 4 / 16 / 64 rows against
// 77 / 197 / 657, AbsorbQueries 1956 / 6152 us at 128 / 512 rows against 2238 / 7040).
constexpr int64_t kAbsorbGemmMaxRows = 64;
// Rows of one sequence scored together over a run of keys (each key block decoded once for
// them all: kernels::IndexerScoresApproxRows); their prepared queries, 8 KiB of floats each
// at 16 x 128, stay in L2.
constexpr int64_t kIndexerRowsPerTask = 16;
// Rows that end inside a run of keys (a prefill chunk's causal edge) are grouped too when their
// positions lie within this span: a group scores every row up to its last row's end, and each
// row's score buffer has this many floats of slack for the keys past its own end.
constexpr int64_t kIndexerEdgeSpan = 16;
// Keys scored per wave of rows (8 bytes each: score and bound): 128 MiB at most.
constexpr int64_t kIndexerWaveKeys = int64_t{1} << 24;

const uint8_t* RowPtr(const kernels::WeightView& w, int64_t row) {
  return static_cast<const uint8_t*>(w.data) + row * w.ld * static_cast<int64_t>(DTypeSize(w.dtype));
}
kernels::WeightView SubRows(const kernels::WeightView& w, int64_t row, int64_t n) {
  return {w.dtype, RowPtr(w, row), n, w.n_in, w.ld};
}
bool NonAbsorbed(const BatchSequence& q) {
  return (q.grouping == RowGrouping::kChunk && q.start == 0 && q.n_tokens > 1) ||
         q.grouping == RowGrouping::kPromptRest;
}
}  // namespace

Status Model::Attention(int64_t layer, const float* x, const BatchPlan& plan, const ParallelStep& step,
                        float* out) const {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layer(layer);
  // H: the heads this rank holds (all of them unless the TP group shares them out).
  const int64_t D = c.hidden_size, H = weights_->local_heads(), Lq = c.q_lora_rank, Lkv = c.kv_lora_rank;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr;
  const int64_t S = plan.n_rows, K = c.index_topk;
  const float scale = c.AttentionScale();
  OpScope op_scope(kOpMlaProlog);

  // qr = bf16(RMSNorm(bf16(x Wq_a^T)));  q = bf16(qr Wq_b^T), rope on the last dr dims per head.
  ScratchVector<float> qr(static_cast<size_t>(S * Lq));
  PlannedLinear(lw.q_a, x, plan, qr.data());
  pool_->ParallelFor(S, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* row = &qr[i * Lq];
      kernels::RoundToBf16InPlace(row, Lq);
      kernels::RmsNorm(row, lw.q_norm.data(), Lq, kNormEps, row);
      kernels::RoundToBf16InPlace(row, Lq);
    }
  }, 16);
  ScratchVector<float> q(static_cast<size_t>(S * H * dqk));
  PlannedLinear(lw.q_b, qr.data(), plan, q.data());
  pool_->ParallelFor(S, [&](int64_t b, int64_t e) {
    RowAngles angles;
    for (int64_t i = b; i < e; ++i) {
      float* row = &q[i * H * dqk];
      kernels::RoundToBf16InPlace(row, H * dqk);
      kernels::RopeAngles(dr, plan.row_pos[i], rope_freqs_.data(), angles.cos, angles.sin);
      for (int64_t h = 0; h < H; ++h) kernels::ApplyRopeInterleaved(row + h * dqk + dn, dr, angles.cos, angles.sin);
      kernels::RoundToBf16InPlace(row, H * dqk);
    }
  }, 8);

  // kv = bf16(x Wkv_a^T): latent c = bf16(RMSNorm(kv[:Lkv])) stored in the cache's format (the
  // fp8 form is the reference's round trip, losslessly); k_pe = rope(kv[Lkv:]) as bf16.
  ScratchVector<float> kva(static_cast<size_t>(S * (Lkv + dr)));
  PlannedLinear(lw.kv_a, x, plan, kva.data());
  pool_->ParallelFor(S, [&](int64_t b, int64_t e) {
    std::vector<float> latent(static_cast<size_t>(Lkv));
    for (int64_t i = b; i < e; ++i) {
      const int64_t pos = plan.row_pos[i];
      const KvSequenceRef& kv = plan.seqs[plan.row_seq[i]].kv;
      float* row = &kva[i * (Lkv + dr)];
      kernels::RoundToBf16InPlace(row, Lkv + dr);
      kernels::RmsNorm(row, lw.kv_norm.data(), Lkv, kNormEps, latent.data());
      kernels::RoundToBf16InPlace(latent.data(), Lkv);
      kernels::EncodeLatent(kv.layout->latent_format, latent.data(), Lkv, kv.Field(layer, KvComponent::kLatentCodes, pos),
                            kv.Field(layer, KvComponent::kLatentScales, pos));
      float* kpe = row + Lkv;
      kernels::ApplyRopeInterleaved(kpe, dr, pos, rope_freqs_.data());
      uint8_t* dst = kv.Field(layer, KvComponent::kRope, pos);
      for (int64_t j = 0; j < dr; ++j) {
        const uint16_t bits = F32ToBf16Bits(kpe[j]);
        std::memcpy(dst + 2 * j, &bits, 2);
      }
    }
  }, 4);

  // Sparse selection per query.
  std::vector<int32_t> topk(static_cast<size_t>(S * K), -1);
  PDSERVE_RETURN_IF_ERROR(Indexer(layer, x, qr.data(), plan, step, &topk));
  op_scope.Switch(kOpAttention);
  for (int64_t s = 0; s < plan.n_seqs(); ++s) {
    const BatchSequence& sq = plan.seqs[s];
    if (!sq.options) continue;
    // Row r holds position row_pos[r] (in a CP prefill not every position of the sequence is
    // here): forced selections and the trace are indexed by the position within the call.
    const int64_t Sq = sq.n_tokens;
    for (int64_t r = plan.seq_row[s]; r < plan.seq_row[s + 1]; ++r) {
      const int64_t i = plan.row_pos[r] - sq.start;
      if (sq.options->forced_topk)
        std::copy_n(sq.options->forced_topk->begin() + (layer * Sq + i) * K, K, topk.begin() + r * K);
      if (sq.options->trace)
        std::copy_n(topk.begin() + r * K, K, sq.options->trace->topk.begin() + (layer * Sq + i) * K);
    }
  }

  std::vector<float> o(static_cast<size_t>(S * H * dv));
  const bool kv_b_bf16 = lw.kv_b.view.dtype == DType::kBF16;
  std::vector<int64_t> absorbed;  // rows taking the absorbed form
  for (int64_t s = 0; s < plan.n_seqs(); ++s) {
    const BatchSequence& sq = plan.seqs[s];
    const int64_t r0 = plan.seq_row[s];
    if (!NonAbsorbed(sq)) {
      for (int64_t i = 0; i < sq.n_tokens; ++i) absorbed.push_back(r0 + i);
      continue;
    }
    // Reference prefill: k_nope | v = bf16(c Wkv_b^T) for every key, scores over [k_nope, k_pe].
    // Keys [0, T) cover the sequence's rows' causal context; the rows are positions [0, n_q)
    // or, in a CP prefill, this rank's positions (the gathered cache holds every key).
    const int64_t n_q = plan.seq_row[s + 1] - r0;
    int64_t T = 0;
    for (int64_t i = 0; i < n_q; ++i) T = std::max(T, plan.row_pos[r0 + i] + 1);
    const kernels::KvTokenView kv_view = sq.kv.View(layer);
    std::vector<float> c_all(static_cast<size_t>(T * Lkv)), kv(static_cast<size_t>(T * H * (dn + dv)));
    std::vector<float> kpe_all(static_cast<size_t>(T * dr));
    std::vector<int32_t> all(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) all[t] = static_cast<int32_t>(t);
    kernels::GatherLatent(kv_view, all.data(), T, c_all.data(), kpe_all.data());
    if (plan.stats) plan.stats->kv_bytes_read += T * (kv_view.latent_stride + kv_view.latent_scale_stride + kv_view.kpe_stride);
    if (step.cp) {
      // Each CP rank expands its own keys; the others arrive by all-gather.
      PDSERVE_RETURN_IF_ERROR(ExpandCpKeys(layer, plan, step, &kv));
    } else {
      ApplyLinear(lw.kv_b, c_all.data(), T, kv.data(), pool_);
      RoundToBf16InPlace(kv.data(), T * H * (dn + dv), pool_);
    }
    // Head-major: a thread's run of items is one head's queries, so that head's keys (T rows of
    // dn + dv values and the shared k_pe) stay in L2 across them; query-major order streamed
    // all H heads' keys from L3 for every query.
    pool_->ParallelFor(n_q * H, [&](int64_t b, int64_t e) {
      std::vector<float> p(static_cast<size_t>(K));
      for (int64_t qh = b; qh < e; ++qh) {
        const int64_t h = qh / n_q, i = qh % n_q;
        const int32_t* sel = &topk[(r0 + i) * K];
        int64_t n = 0;
        while (n < K && sel[n] >= 0) ++n;
        // Key t of head h: kv[(t * H + h) * (dn + dv)], so the head's keys are H * (dn + dv) apart.
        kernels::ExpandedAttentionHead(&q[((r0 + i) * H + h) * dqk], &kv[h * (dn + dv)], H * (dn + dv), kpe_all.data(),
                                       sel, n, dn, dr, dv, scale, &o[((r0 + i) * H + h) * dv], p.data());
      }
    });
  }

  // Absorbed form over the latent cache (decode, or a chunk after a cached prefix).
  const int64_t nA = static_cast<int64_t>(absorbed.size());
  if (plan.stats && nA > 0) {
    const KvLayout& l = *plan.seqs[plan.row_seq[absorbed[0]]].kv.layout;
    const int64_t rec = l.ComponentBytesPerToken(KvComponent::kLatentCodes) +
                        l.ComponentBytesPerToken(KvComponent::kLatentScales) + l.ComponentBytesPerToken(KvComponent::kRope);
    for (int64_t r : absorbed) {
      int64_t n = 0;
      while (n < K && topk[r * K + n] >= 0) ++n;
      plan.stats->kv_bytes_read += n * rec;
    }
  }
  if (nA > 0) {
    // q_lat[r, h] = bf16(q_nope[r, h] W_uk[h]): rows h*(dn+dv) .. +dn of Wkv_b, each of length
    // Lkv, one fma chain in d order per output. Up to kAbsorbGemmMaxRows rows, a GEMM per head
    // against W_uk prepacked transposed (the GEMM's chains are the same, whatever m); above,
    // AbsorbQueries over W_uk's rows (each row read once for all queries) is faster. One thread
    // per head in both: a grouped call that cuts each head's GEMM across the threads was
    // slower at every batch (16 heads, 1-512 rows, in-process A/Bs).
    ScratchVector<float> qlat(static_cast<size_t>(nA * H * Lkv)), olat(static_cast<size_t>(nA * H * Lkv));
    if (!lw.kv_b_uk_t.empty() && nA <= kAbsorbGemmMaxRows) {
      ScratchVector<float> q_gathered;
      const float* qa = &q[absorbed.front() * H * dqk];
      if (absorbed.back() - absorbed.front() != nA - 1) {  // a mixed batch: the absorbed rows side by side
        q_gathered.resize(static_cast<size_t>(nA * H * dqk));
        for (int64_t a = 0; a < nA; ++a) std::copy_n(&q[absorbed[a] * H * dqk], H * dqk, &q_gathered[a * H * dqk]);
        qa = q_gathered.data();
      }
      pool_->ParallelFor(H, [&](int64_t hb, int64_t he) {
        for (int64_t h = hb; h < he; ++h)
          kernels::Gemm(qa + h * dqk, nA, H * dqk, lw.kv_b_uk_t[h].view(), &qlat[h * Lkv], H * Lkv, nullptr);
      });
      RoundToBf16InPlace(qlat.data(), nA * H * Lkv, pool_);
    } else {
      pool_->ParallelFor(H, [&](int64_t hb, int64_t he) {
        std::vector<const float*> q_rows(static_cast<size_t>(nA));
        std::vector<float*> out_rows(static_cast<size_t>(nA));
        for (int64_t h = hb; h < he; ++h) {
          for (int64_t a = 0; a < nA; ++a) {
            q_rows[a] = &q[(absorbed[a] * H + h) * dqk];
            out_rows[a] = &qlat[(a * H + h) * Lkv];
          }
          kernels::AbsorbQueries(q_rows.data(), nA, RowPtr(lw.kv_b.view, h * (dn + dv)), kv_b_bf16, lw.kv_b.view.ld, dn,
                                 Lkv, out_rows.data());
          for (int64_t a = 0; a < nA; ++a) kernels::RoundToBf16InPlace(&qlat[(a * H + h) * Lkv], Lkv);
        }
      });
    }
    // Each row's selected keys are staged once in a compact per-thread stage (bf16 for the fp8
    // and bf16 caches: exact), which every head then reads (kernels/mla_attention.h).
    // Row a's attention on the calling thread with `stage`, or (stage == nullptr) its heads
    // split across the pool.
    auto attend_row = [&](int64_t a, kernels::LatentStage* stage) {
      const int64_t r = absorbed[a];
      const int32_t* sel = &topk[r * K];
      int64_t n = 0;
      while (n < K && sel[n] >= 0) ++n;
      const kernels::KvTokenView kv_view = plan.seqs[plan.row_seq[r]].kv.View(layer);
      auto heads = [&](const kernels::LatentStage& staged, int64_t hb, int64_t he) {
        thread_local AlignedVector<float> p;
        if (p.size() < static_cast<size_t>(2 * (he - hb) * n)) p.resize(static_cast<size_t>(2 * (he - hb) * n));
        kernels::StagedAttentionHeads(staged, &qlat[(a * H + hb) * Lkv], Lkv, &q[(r * H + hb) * dqk + dn], dqk, he - hb,
                                      scale, &olat[(a * H + hb) * Lkv], Lkv, p.data());
      };
      if (stage == nullptr) {
        // One chunk of heads per thread (a 4-head call costs 1.3x per head what an 8-head one
        // does: the output blocks read each staged key for fewer heads), and each thread stages
        // the row's keys itself, in one parallel region: a stage shared across threads cost a
        // second region and every head read half of it from the other core (one row, 16 heads,
        // 512 keys: ~185 -> ~135 us, no faster than one thread before).
        pool_->ParallelForChunks(H, std::max<int64_t>(4, (H + pool_->n_threads() - 1) / pool_->n_threads()),
                                 [&](int64_t hb, int64_t he) {
                                   thread_local kernels::LatentStage own;
                                   kernels::PrepareLatentStage(kv_view, n, &own);
                                   kernels::StageLatent(kv_view, sel, 0, n, &own);
                                   heads(own, hb, he);
                                 });
      } else {
        kernels::PrepareLatentStage(kv_view, n, stage);
        kernels::StageLatent(kv_view, sel, 0, n, stage);
        heads(*stage, 0, H);
      }
    };
    // The stages (up to index_topk x kv_lora_rank values, 512 KiB in bf16 on V3.2) live in
    // per-thread buffers that outlive the call: a fresh one per layer costs its zero-fill.
    if (nA >= 2 * pool_->n_threads()) {
      // One row per claim, the costliest (most keys) first: a row takes ~0.1-0.3 ms, and in
      // ParallelFor's n_threads * 4 chunks one thread sat idle for most of the last chunk (in
      // a prefill chunk the last rows, which have the most keys, came last).
      std::vector<int64_t> keys(static_cast<size_t>(nA)), order(static_cast<size_t>(nA));
      for (int64_t a = 0; a < nA; ++a) {
        const int32_t* sel = &topk[absorbed[a] * K];
        while (keys[a] < K && sel[keys[a]] >= 0) ++keys[a];
      }
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return keys[x] > keys[y]; });
      pool_->ParallelForChunks(nA, 1, [&](int64_t b, int64_t e) {
        thread_local kernels::LatentStage stage;
        for (int64_t i = b; i < e; ++i) attend_row(order[i], &stage);
      });
    } else {
      for (int64_t a = 0; a < nA; ++a) attend_row(a, nullptr);
    }
    // o[r, h] = bf16(o_lat[r, h] W_uv[h]^T): rows h*(dn+dv)+dn .. +dv, every row in one call
    // per head (the GEMM's per-row result does not depend on m).
    std::vector<float> oA(static_cast<size_t>(nA * H * dv));
    pool_->ParallelFor(H, [&](int64_t hb, int64_t he) {
      for (int64_t h = hb; h < he; ++h)
        kernels::Gemm(&olat[h * Lkv], nA, H * Lkv,
                      lw.kv_b_uv.empty() ? SubRows(lw.kv_b.view, h * (dn + dv) + dn, dv) : lw.kv_b_uv[h].view(), &oA[h * dv],
                      H * dv, nullptr);
    });
    RoundToBf16InPlace(oA.data(), nA * H * dv, pool_);
    for (int64_t a = 0; a < nA; ++a) std::copy_n(&oA[a * H * dv], H * dv, &o[absorbed[a] * H * dv]);
  }
  op_scope.Switch(kOpOProj);
  PlannedLinear(lw.o, o.data(), plan, out);
  if (comm::TensorParallel* tp = parallel_ ? parallel_->tp() : nullptr) {
    // o_proj is input-sharded by heads: each TP rank holds a partial sum of every output.
    CommTimer timer(parallel_);
    PDSERVE_RETURN_IF_ERROR(tp->SumPartials({out, static_cast<size_t>(S * D)}));
  }
  RoundToBf16InPlace(out, S * D, pool_);
  return Status::Ok();
}

Status Model::Indexer(int64_t layer, const float* x, const float* qr, const BatchPlan& plan,
                      const ParallelStep& step, std::vector<int32_t>* topk) const {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layer(layer);
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
  const int64_t dr = c.qk_rope_head_dim, S = plan.n_rows, K = c.index_topk;
  const float hadamard_scale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5));
  OpScope op_scope(kOpIndexer);

  // Queries: bf16(qr Wiq^T), rope (half-split) on the first dr dims, Hadamard, fp8 per head.
  ScratchVector<float> iq(static_cast<size_t>(S * IH * ID));
  PlannedLinear(lw.idx_wq_b, qr, plan, iq.data());
  RoundToBf16InPlace(iq.data(), S * IH * ID, pool_);
  // Keys: bf16(LayerNorm(bf16(x Wk^T))), rope, Hadamard, quantized per token -> cache.
  ScratchVector<float> ik(static_cast<size_t>(S * ID));
  PlannedLinear(lw.idx_wk, x, plan, ik.data());
  RoundToBf16InPlace(ik.data(), S * ID, pool_);
  // Head weights in fp32: wp(x) * IH^-0.5, later * q_scale * ID^-0.5.
  std::vector<float> wts(static_cast<size_t>(S * IH));
  PlannedLinear(lw.idx_weights_proj, x, plan, wts.data());
  std::vector<uint8_t> q8(static_cast<size_t>(S * IH * ID));
  std::vector<float> qs(static_cast<size_t>(S * IH));
  const float ih_scale = static_cast<float>(std::pow(static_cast<double>(IH), -0.5));
  pool_->ParallelFor(S, [&](int64_t rb, int64_t re) {
    RowAngles angles;
    for (int64_t i = rb; i < re; ++i) {
      const int64_t pos = plan.row_pos[i];
      kernels::RopeAngles(dr, pos, rope_freqs_.data(), angles.cos, angles.sin);
      for (int64_t h = 0; h < IH; ++h) {
        float* v = &iq[(i * IH + h) * ID];
        IndexerRope(v, dr, pos, rope_freqs_.data(), angles.cos, angles.sin);
        kernels::RoundToBf16InPlace(v, ID);
        kernels::HadamardTransform(v, ID);
        for (int64_t d = 0; d < ID; ++d) v[d] *= hadamard_scale;
        kernels::RoundToBf16InPlace(v, ID);
        kernels::ActQuantFp8(v, ID, &q8[(i * IH + h) * ID], &qs[i * IH + h]);
        float& w = wts[i * IH + h];
        w = w * ih_scale;
        w = w * qs[i * IH + h];
        w = w * hadamard_scale;
      }
      float* k = &ik[i * ID];
      kernels::LayerNorm(k, lw.idx_k_norm_w.data(), lw.idx_k_norm_b.data(), ID, kNormEps, k);
      kernels::RoundToBf16InPlace(k, ID);
      IndexerRope(k, dr, pos, rope_freqs_.data(), angles.cos, angles.sin);
      kernels::RoundToBf16InPlace(k, ID);
      kernels::HadamardTransform(k, ID);
      for (int64_t d = 0; d < ID; ++d) k[d] *= hadamard_scale;
      kernels::RoundToBf16InPlace(k, ID);
      const KvSequenceRef& kv = plan.seqs[plan.row_seq[i]].kv;
      kernels::EncodeIndexKey(kv.layout->index_format, k, ID, kv.Field(layer, KvComponent::kIndexCodes, pos),
                              kv.Field(layer, KvComponent::kIndexScales, pos));
    }
  }, 2);
  // A CP rank now has its own positions' records of this layer; the scores need all of them.
  if (step.cp) PDSERVE_RETURN_IF_ERROR(GatherCpRecords(layer, plan, step));

  // score[t] = ks[t] * sum_h w[h] * relu(q8[h] . k8[t]) over causal keys; then top-k. A row
  // with at most K causal keys selects them all. A traced row scores every key exactly (the
  // trace records the scores); the others take the fp32 scores with certified bounds and
  // rescore exactly only the keys near the cut (kernels/indexer.h): the same selection.
  // Work items are (rows, run of keys) so one long row still uses every thread, and a prefill
  // chunk's rows decode each key block once between them; rows go in waves of at most
  // kIndexerWaveKeys keys, which bounds the score buffers of a long prefill.
  enum class Mode : uint8_t { kSkip, kAll, kExact, kApprox };
  std::vector<Mode> mode(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    const BatchSequence& sq = plan.seqs[plan.row_seq[i]];
    const bool traced = sq.options && sq.options->trace;
    const bool forced = sq.options && sq.options->forced_topk;
    const int64_t n_keys = plan.row_pos[i] + 1;
    mode[i] = traced ? Mode::kExact : forced ? Mode::kSkip : n_keys <= K ? Mode::kAll : Mode::kApprox;
  }
  // A task scores keys [begin, end) for rows [row_begin, row_end): one row, or rows of one
  // sequence that all cover those keys (a prefill chunk's rows share their keys).
  struct Task { int64_t row_begin, row_end, begin, end; };
  std::vector<Task> tasks;
  std::vector<int64_t> score_off;
  std::vector<float> scores, bounds;
  std::vector<kernels::IndexerQuery> queries;  // the wave's scored rows (kApprox, kExact), prepared once
  int64_t row0 = 0;
  while (row0 < S) {
    // One wave: rows [row0, row1).
    int64_t row1 = row0, total = 0;
    tasks.clear();
    score_off.assign(1, 0);
    int64_t scored_keys = 0;
    while (row1 < S && (row1 == row0 || total < kIndexerWaveKeys)) {
      const Mode m = mode[row1];
      const int64_t n_keys = m == Mode::kExact || m == Mode::kApprox ? plan.row_pos[row1] + 1 : 0;
      scored_keys += n_keys;
      total += n_keys > 0 ? n_keys + kIndexerEdgeSpan : 0;
      score_off.push_back(total);
      ++row1;
    }
    // Runs of kApprox rows of one sequence with ascending positions (so the rows covering a
    // key block are a suffix of the run) share tasks; every other scored row has its own.
    for (int64_t r = row0; r < row1;) {
      int64_t run_end = r + 1;
      if (mode[r] == Mode::kApprox) {
        while (run_end < row1 && mode[run_end] == Mode::kApprox && plan.row_seq[run_end] == plan.row_seq[r] &&
               plan.row_pos[run_end] > plan.row_pos[run_end - 1])
          ++run_end;
      }
      if (mode[r] != Mode::kExact && mode[r] != Mode::kApprox) {
        r = run_end;
        continue;
      }
      const int64_t max_keys = plan.row_pos[run_end - 1] + 1;
      for (int64_t b = 0; b < max_keys; b += kIndexerKeysPerTask) {
        const int64_t e = b + kIndexerKeysPerTask;
        int64_t full = run_end;  // the rows [full, run_end) cover all of [b, e)
        while (full > r && plan.row_pos[full - 1] + 1 >= e) --full;
        // Rows [r, full) end inside [b, e) (those ending at or before b have nothing here):
        // groups of up to kIndexerRowsPerTask rows within kIndexerEdgeSpan positions, each
        // scored to its last row's end (the others' extra keys land in their slack). A prefill
        // chunk's causal edge then decodes each key block once per group, not once per row
        // (in-process A/B, scoring per layer call: the chunk at 512 4.20 -> 2.52 ms, chunks at
        // 1K-3K 11-13% faster, at 4K-7K 1-5%).
        int64_t i = r;
        while (i < full && plan.row_pos[i] + 1 <= b) ++i;
        while (i < full) {
          int64_t g1 = i + 1;
          while (g1 < full && g1 - i < kIndexerRowsPerTask && plan.row_pos[g1] - plan.row_pos[i] < kIndexerEdgeSpan) ++g1;
          tasks.push_back({i, g1, b, plan.row_pos[g1 - 1] + 1});
          i = g1;
        }
        for (int64_t i = full; i < run_end; i += kIndexerRowsPerTask)
          tasks.push_back({i, std::min(run_end, i + kIndexerRowsPerTask), b, e});
      }
      r = run_end;
    }
    scores.resize(static_cast<size_t>(total));
    bounds.resize(static_cast<size_t>(total));
    if (plan.stats) plan.stats->kv_bytes_read += scored_keys * (ID + 4);
    op_scope.Switch(kOpIndexer);
    queries.resize(static_cast<size_t>(row1 - row0));
    pool_->ParallelFor(row1 - row0, [&](int64_t b, int64_t e) {
      for (int64_t i = row0 + b; i < row0 + e; ++i)
        if (mode[i] == Mode::kApprox || mode[i] == Mode::kExact)
          kernels::PrepareIndexerQuery(&q8[i * IH * ID], &wts[i * IH], IH, ID, &queries[i - row0]);
    }, 8);
    // Claimed one at a time, the costliest first (rows x keys): ParallelFor's n_threads * 4
    // contiguous chunks of uneven tasks (whole 16-row groups, then single rows at a chunk's
    // causal edge) left one thread finishing a chunk while the other waited.
    auto cost = [](const Task& t) { return (t.row_end - t.row_begin) * (t.end - t.begin); };
    std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& x, const Task& y) { return cost(x) > cost(y); });
    pool_->ParallelForChunks(static_cast<int64_t>(tasks.size()), 1, [&](int64_t b, int64_t e) {
      std::vector<const kernels::IndexerQuery*> qs;
      std::vector<float*> approx, bound;
      for (int64_t j = b; j < e; ++j) {
        const Task& t = tasks[j];
        const kernels::KvTokenView view = plan.seqs[plan.row_seq[t.row_begin]].kv.View(layer);
        if (mode[t.row_begin] == Mode::kExact) {
          const kernels::IndexerQuery& iq = queries[t.row_begin - row0];
          kernels::IndexerScores(view, iq.qd.data(), iq.w.data(), IH, t.begin, t.end, &scores[score_off[t.row_begin - row0]]);
          continue;
        }
        qs.clear();
        approx.clear();
        bound.clear();
        for (int64_t i = t.row_begin; i < t.row_end; ++i) {
          const int64_t off = score_off[i - row0];
          qs.push_back(&queries[i - row0]);
          approx.push_back(&scores[off + t.begin]);
          bound.push_back(&bounds[off + t.begin]);
        }
        kernels::IndexerScoresApproxRows(view, qs.data(), t.row_end - t.row_begin, t.begin, t.end, approx.data(),
                                         bound.data());
      }
    });
    op_scope.Switch(kOpIndexerTopk);
    pool_->ParallelFor(row1 - row0, [&](int64_t b, int64_t e) {
      std::vector<int32_t> scratch;
      for (int64_t i = row0 + b; i < row0 + e; ++i) {
        int32_t* out = &(*topk)[i * K];
        const int64_t n_keys = plan.row_pos[i] + 1, off = score_off[i - row0];
        switch (mode[i]) {
          case Mode::kSkip:
            break;
          case Mode::kAll:
            for (int64_t t = 0; t < n_keys; ++t) out[t] = static_cast<int32_t>(t);
            break;
          case Mode::kExact:
            scratch.resize(static_cast<size_t>(n_keys));
            kernels::TopKIndices(&scores[off], n_keys, K, out, scratch.data());
            break;
          case Mode::kApprox:
            kernels::IndexerTopK(plan.seqs[plan.row_seq[i]].kv.View(layer), queries[i - row0], &scores[off], &bounds[off],
                                 n_keys, K, out);
            break;
        }
      }
    });
    // Traced rows: the trace records their exact scores.
    for (int64_t r = row0; r < row1; ++r) {
      if (mode[r] != Mode::kExact) continue;
      const BatchSequence& sq = plan.seqs[plan.row_seq[r]];
      const int64_t Sq = sq.n_tokens, T = sq.start + Sq, i = plan.row_pos[r] - sq.start;
      std::copy_n(scores.begin() + score_off[r - row0], plan.row_pos[r] + 1,
                  sq.options->trace->index_scores.begin() + (layer * Sq + i) * T);
    }
    row0 = row1;
  }
  return Status::Ok();
}

}  // namespace pdserve::model
