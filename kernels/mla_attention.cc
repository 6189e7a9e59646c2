#include "kernels/mla_attention.h"

#include <algorithm>
#include <cstring>

#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_quant.h"

namespace pdserve::kernels {

void GatherLatent(const KvTokenView& kv, const int32_t* sel, int64_t n, float* c_out, float* kpe_out) {
  const float* table = Fp8E4M3DecodeTable();
  const int64_t blocks = kv.latent_dim / kFp8BlockSize;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t t = sel[j];
    const uint8_t* codes = kv.Field(t, kv.latent_offset, kv.latent_stride);
    const float* scales = reinterpret_cast<const float*>(kv.Field(t, kv.latent_scale_offset, kv.latent_scale_stride));
    float* c = c_out + j * kv.latent_dim;
    for (int64_t b = 0; b < blocks; ++b) {
      const float s = scales[b];
      for (int64_t i = 0; i < kFp8BlockSize; ++i) c[b * kFp8BlockSize + i] = table[codes[b * kFp8BlockSize + i]] * s;
    }
    const uint16_t* kpe = reinterpret_cast<const uint16_t*>(kv.Field(t, kv.kpe_offset, kv.kpe_stride));
    for (int64_t i = 0; i < kv.rope_dim; ++i) kpe_out[j * kv.rope_dim + i] = Bf16ToF32(kpe[i]);
  }
}

void AbsorbedAttentionHead(const float* q_lat, const float* q_pe, const float* c, const float* kpe,
                           int64_t n, int64_t latent_dim, int64_t rope_dim, float scale,
                           float* o_lat, float* scratch) {
  for (int64_t j = 0; j < n; ++j) {
    const float s_lat = RoundToBf16(DotF32(q_lat, c + j * latent_dim, latent_dim));
    const float s_pe = RoundToBf16(DotF32(q_pe, kpe + j * rope_dim, rope_dim));
    scratch[j] = RoundToBf16(RoundToBf16(s_lat + s_pe) * scale);
  }
  Softmax(scratch, n);
  RoundToBf16InPlace(scratch, n);
  std::fill(o_lat, o_lat + latent_dim, 0.0f);
  for (int64_t j = 0; j < n; ++j) Axpy(scratch[j], c + j * latent_dim, latent_dim, o_lat);
  RoundToBf16InPlace(o_lat, latent_dim);
}

void IndexerScores(const KvTokenView& kv, const double* q_decoded, const float* w, int64_t n_heads,
                   int64_t n_keys, float* scores) {
  const int64_t dim = kv.index_dim;
  for (int64_t t = 0; t < n_keys; ++t) {
    const uint8_t* k = kv.Field(t, kv.idx_k_offset, kv.idx_k_stride);
    float acc = 0.0f;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float dot = Fp8DotExactDecodedA(q_decoded + h * dim, k, dim);
      acc += std::max(dot, 0.0f) * w[h];
    }
    float ks;
    std::memcpy(&ks, kv.Field(t, kv.idx_scale_offset, kv.idx_scale_stride), 4);
    scores[t] = acc * ks;
  }
}

}  // namespace pdserve::kernels
