// Scalar reference for the Lightning Indexer scores and selection (kernels/indexer.h,
// IndexerScores in kernels/mla_attention.h): every dot in double (exact for fp8 x fp8 and
// fp8 x int8 over <= 1024 terms), rounded once to fp32, then the fma chain over heads in
// head order and the key scale, exactly as the model's definition reads; the selection is
// TopKIndices over those scores. Header-only; slow; for tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_quant.h"
#include "kernels/mla_attention.h"

namespace pdserve::kernels {

// score of key t for the query q8 [n_heads, dim] (e4m3 codes) with head weights w.
inline float IndexerScoreRef(const KvTokenView& kv, const uint8_t* q8, const float* w, int64_t n_heads, int64_t t) {
  const float* table = pdserve::Fp8E4M3DecodeTable();
  const uint8_t* k = kv.Field(t, kv.idx_k_offset, kv.idx_k_stride);
  float acc = 0.0f;
  for (int64_t h = 0; h < n_heads; ++h) {
    double d = 0.0;
    for (int64_t i = 0; i < kv.index_dim; ++i) {
      const double kv_i = kv.index_format == KvIndexFormat::kFp8 ? static_cast<double>(table[k[i]])
                                                                 : static_cast<double>(static_cast<int8_t>(k[i]));
      d += static_cast<double>(table[q8[h * kv.index_dim + i]]) * kv_i;
    }
    acc = std::fma(std::max(static_cast<float>(d), 0.0f), w[h], acc);
  }
  float ks;
  std::memcpy(&ks, kv.Field(t, kv.idx_scale_offset, kv.idx_scale_stride), 4);
  return acc * ks;
}

// The top-k keys of [0, n) by IndexerScoreRef, ascending (TopKIndices' contract).
inline std::vector<int32_t> IndexerTopKRef(const KvTokenView& kv, const uint8_t* q8, const float* w, int64_t n_heads,
                                           int64_t n, int64_t k) {
  std::vector<float> s(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) s[t] = IndexerScoreRef(kv, q8, w, n_heads, t);
  std::vector<int32_t> out(static_cast<size_t>(std::min(k, n))), scratch(static_cast<size_t>(n));
  TopKIndices(s.data(), n, k, out.data(), scratch.data());
  return out;
}

}  // namespace pdserve::kernels
