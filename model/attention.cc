// MLA attention and the Lightning Indexer of one layer (members of Model).
// The rounding points follow docs/model-numerics.md step by step; "bf16(...)" below means
// the value is rounded to bf16 there, as the reference does.
#include <cmath>
#include <limits>

#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_quant.h"
#include "kernels/mla_attention.h"
#include "kernels/rope.h"
#include "model/model.h"

namespace pdserve::model {

namespace {
constexpr float kNormEps = 1e-6f;

const uint8_t* RowPtr(const kernels::WeightView& w, int64_t row) {
  return static_cast<const uint8_t*>(w.data) + row * w.ld * static_cast<int64_t>(DTypeSize(w.dtype));
}
kernels::WeightView SubRows(const kernels::WeightView& w, int64_t row, int64_t n) {
  return {w.dtype, RowPtr(w, row), n, w.n_in, w.ld};
}
}  // namespace

void Model::Attention(int64_t layer, const float* x, int64_t S, int64_t start, SequenceKvCache* cache,
                      const ForwardOptions& opt, float* out) const {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layer(layer);
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Lq = c.q_lora_rank, Lkv = c.kv_lora_rank;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, dqk = dn + dr;
  const int64_t T = start + S, K = c.index_topk;
  const float scale = c.AttentionScale();

  // qr = bf16(RMSNorm(bf16(x Wq_a^T)));  q = bf16(qr Wq_b^T), rope on the last dr dims per head.
  std::vector<float> qr(static_cast<size_t>(S * Lq));
  ApplyLinear(lw.q_a, x, S, qr.data(), pool_);
  kernels::RoundToBf16InPlace(qr.data(), S * Lq);
  for (int64_t i = 0; i < S; ++i) kernels::RmsNorm(&qr[i * Lq], lw.q_norm.data(), Lq, kNormEps, &qr[i * Lq]);
  kernels::RoundToBf16InPlace(qr.data(), S * Lq);
  std::vector<float> q(static_cast<size_t>(S * H * dqk));
  ApplyLinear(lw.q_b, qr.data(), S, q.data(), pool_);
  kernels::RoundToBf16InPlace(q.data(), S * H * dqk);
  for (int64_t i = 0; i < S; ++i)
    for (int64_t h = 0; h < H; ++h)
      kernels::ApplyRopeInterleaved(&q[(i * H + h) * dqk + dn], dr, start + i, rope_freqs_.data());
  kernels::RoundToBf16InPlace(q.data(), S * H * dqk);

  // kv = bf16(x Wkv_a^T): latent c = fp8_roundtrip(bf16(RMSNorm(kv[:Lkv]))), k_pe = rope(kv[Lkv:]).
  std::vector<float> kva(static_cast<size_t>(S * (Lkv + dr)));
  ApplyLinear(lw.kv_a, x, S, kva.data(), pool_);
  kernels::RoundToBf16InPlace(kva.data(), S * (Lkv + dr));
  std::vector<float> latent(static_cast<size_t>(Lkv));
  for (int64_t i = 0; i < S; ++i) {
    const int64_t pos = start + i;
    float* row = &kva[i * (Lkv + dr)];
    kernels::RmsNorm(row, lw.kv_norm.data(), Lkv, kNormEps, latent.data());
    kernels::RoundToBf16InPlace(latent.data(), Lkv);
    kernels::ActQuantFp8(latent.data(), Lkv, cache->latent_codes(layer, pos), cache->latent_scales(layer, pos));
    float* kpe = row + Lkv;
    kernels::ApplyRopeInterleaved(kpe, dr, pos, rope_freqs_.data());
    uint16_t* dst = cache->k_pe(layer, pos);
    for (int64_t j = 0; j < dr; ++j) dst[j] = F32ToBf16Bits(kpe[j]);
  }

  // Sparse selection per query.
  std::vector<int32_t> topk(static_cast<size_t>(S * K), -1);
  Indexer(layer, x, qr.data(), S, start, cache, opt, &topk);
  if (opt.forced_topk)
    std::copy(opt.forced_topk->begin() + layer * S * K, opt.forced_topk->begin() + (layer + 1) * S * K, topk.begin());
  if (opt.trace) std::copy(topk.begin(), topk.end(), opt.trace->topk.begin() + layer * S * K);

  std::vector<float> o(static_cast<size_t>(S * H * dv));
  const kernels::KvTokenView kv_view = cache->View(layer);
  const bool kv_b_bf16 = lw.kv_b.view.dtype == DType::kBF16;
  if (start == 0 && S > 1) {
    // Reference prefill: k_nope | v = bf16(c Wkv_b^T) for every key, scores over [k_nope, k_pe].
    std::vector<float> c_all(static_cast<size_t>(T * Lkv)), kv(static_cast<size_t>(T * H * (dn + dv)));
    std::vector<float> kpe_all(static_cast<size_t>(T * dr));
    std::vector<int32_t> all(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) all[t] = static_cast<int32_t>(t);
    kernels::GatherLatent(kv_view, all.data(), T, c_all.data(), kpe_all.data());
    ApplyLinear(lw.kv_b, c_all.data(), T, kv.data(), pool_);
    kernels::RoundToBf16InPlace(kv.data(), T * H * (dn + dv));
    pool_->ParallelFor(S * H, [&](int64_t b, int64_t e) {
      std::vector<float> p(static_cast<size_t>(K));
      for (int64_t qh = b; qh < e; ++qh) {
        const int64_t i = qh / H, h = qh % H;
        const int32_t* sel = &topk[i * K];
        const float* qv = &q[(i * H + h) * dqk];
        int64_t n = 0;
        for (int64_t j = 0; j < K && sel[j] >= 0; ++j, ++n) {
          const int64_t t = sel[j];
          const float* kn = &kv[(t * H + h) * (dn + dv)];
          float dot = kernels::DotF32(qv, kn, dn) + kernels::DotF32(qv + dn, &kpe_all[t * dr], dr);
          p[j] = RoundToBf16(RoundToBf16(dot) * scale);
        }
        kernels::Softmax(p.data(), n);
        kernels::RoundToBf16InPlace(p.data(), n);
        float* ov = &o[(i * H + h) * dv];
        std::fill(ov, ov + dv, 0.0f);
        for (int64_t j = 0; j < n; ++j) kernels::Axpy(p[j], &kv[(sel[j] * H + h) * (dn + dv) + dn], dv, ov);
        kernels::RoundToBf16InPlace(ov, dv);
      }
    });
  } else {
    // Absorbed form over the latent cache (decode, or a chunk after a cached prefix).
    for (int64_t i = 0; i < S; ++i) {
      const int32_t* sel = &topk[i * K];
      int64_t n = 0;
      while (n < K && sel[n] >= 0) ++n;
      std::vector<float> csel(static_cast<size_t>(n * Lkv)), kpesel(static_cast<size_t>(n * dr));
      pool_->ParallelFor(n, [&](int64_t b, int64_t e) {
        kernels::GatherLatent(kv_view, sel + b, e - b, &csel[b * Lkv], &kpesel[b * dr]);
      }, 16);
      pool_->ParallelFor(H, [&](int64_t hb, int64_t he) {
        std::vector<float> qlat(static_cast<size_t>(Lkv)), p(static_cast<size_t>(n)), olat(static_cast<size_t>(Lkv));
        for (int64_t h = hb; h < he; ++h) {
          const float* qv = &q[(i * H + h) * dqk];
          // q_lat = bf16(q_nope W_uk[h]): rows h*(dn+dv) .. +dn of Wkv_b, each of length Lkv.
          std::fill(qlat.begin(), qlat.end(), 0.0f);
          for (int64_t d = 0; d < dn; ++d)
            kernels::AxpyRow(qv[d], RowPtr(lw.kv_b.view, h * (dn + dv) + d), kv_b_bf16, Lkv, qlat.data());
          kernels::RoundToBf16InPlace(qlat.data(), Lkv);
          kernels::AbsorbedAttentionHead(qlat.data(), qv + dn, csel.data(), kpesel.data(), n, Lkv, dr, scale,
                                         olat.data(), p.data());
          // o[h] = bf16(o_lat W_uv[h]^T): rows h*(dn+dv)+dn .. +dv.
          float* ov = &o[(i * H + h) * dv];
          kernels::Gemm(olat.data(), 1, Lkv, SubRows(lw.kv_b.view, h * (dn + dv) + dn, dv), ov, dv, nullptr);
          kernels::RoundToBf16InPlace(ov, dv);
        }
      });
    }
  }
  ApplyLinear(lw.o, o.data(), S, out, pool_);
  kernels::RoundToBf16InPlace(out, S * D);
}

void Model::Indexer(int64_t layer, const float* x, const float* qr, int64_t S, int64_t start,
                    SequenceKvCache* cache, const ForwardOptions& opt, std::vector<int32_t>* topk) const {
  const ModelConfig& c = config();
  const LayerWeights& lw = weights_->layer(layer);
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
  const int64_t dr = c.qk_rope_head_dim, T = start + S, K = c.index_topk;
  const float hadamard_scale = static_cast<float>(std::pow(static_cast<double>(ID), -0.5));

  // Queries: bf16(qr Wiq^T), rope (half-split) on the first dr dims, Hadamard, fp8 per head.
  std::vector<float> iq(static_cast<size_t>(S * IH * ID));
  ApplyLinear(lw.idx_wq_b, qr, S, iq.data(), pool_);
  kernels::RoundToBf16InPlace(iq.data(), S * IH * ID);
  // Keys: bf16(LayerNorm(bf16(x Wk^T))), rope, Hadamard, fp8 per token -> cache.
  std::vector<float> ik(static_cast<size_t>(S * ID));
  ApplyLinear(lw.idx_wk, x, S, ik.data(), pool_);
  kernels::RoundToBf16InPlace(ik.data(), S * ID);
  // Head weights in fp32: wp(x) * IH^-0.5, later * q_scale * ID^-0.5.
  std::vector<float> wts(static_cast<size_t>(S * IH));
  ApplyLinear(lw.idx_weights_proj, x, S, wts.data(), pool_);
  std::vector<uint8_t> q8(static_cast<size_t>(S * IH * ID));
  std::vector<float> qs(static_cast<size_t>(S * IH));
  const float ih_scale = static_cast<float>(std::pow(static_cast<double>(IH), -0.5));
  for (int64_t i = 0; i < S; ++i) {
    const int64_t pos = start + i;
    for (int64_t h = 0; h < IH; ++h) {
      float* v = &iq[(i * IH + h) * ID];
      kernels::ApplyRopeHalfSplit(v, dr, pos, rope_freqs_.data());
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
    kernels::ApplyRopeHalfSplit(k, dr, pos, rope_freqs_.data());
    kernels::RoundToBf16InPlace(k, ID);
    kernels::HadamardTransform(k, ID);
    for (int64_t d = 0; d < ID; ++d) k[d] *= hadamard_scale;
    kernels::RoundToBf16InPlace(k, ID);
    kernels::ActQuantFp8(k, ID, cache->idx_k(layer, pos), cache->idx_scale(layer, pos));
  }
  if (opt.forced_topk && !opt.trace) return;  // the caller replaces the selections

  // score[t] = ks[t] * sum_h w[h] * relu(q8[h] . k8[t]) over causal keys; then top-k.
  const kernels::KvTokenView kv_view = cache->View(layer);
  pool_->ParallelFor(S, [&](int64_t b, int64_t e) {
    std::vector<double> qd(static_cast<size_t>(IH * ID));
    std::vector<float> scores(static_cast<size_t>(T));
    std::vector<int32_t> scratch(static_cast<size_t>(T));
    const float* table = Fp8E4M3DecodeTable();
    for (int64_t i = b; i < e; ++i) {
      const int64_t n_keys = start + i + 1;
      for (int64_t j = 0; j < IH * ID; ++j) qd[j] = table[q8[i * IH * ID + j]];
      kernels::IndexerScores(kv_view, qd.data(), &wts[i * IH], IH, n_keys, scores.data());
      if (opt.trace)
        std::copy(scores.begin(), scores.begin() + n_keys,
                  opt.trace->index_scores.begin() + (layer * S + i) * T);
      kernels::TopKIndices(scores.data(), n_keys, K, &(*topk)[i * K], scratch.data());
    }
  });
}

}  // namespace pdserve::model
