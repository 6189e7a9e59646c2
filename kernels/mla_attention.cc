#include "kernels/mla_attention.h"

#include <immintrin.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_quant.h"

namespace pdserve::kernels {

namespace {

// C8 / INT8 scale: amax / 127, with an all-zero vector stored as scale 1 (codes all 0).
float Int8Scale(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax > 0.0f ? amax / 127.0f : 1.0f;
}

void QuantInt8(const float* x, int64_t n, float scale, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) {
    const float q = std::clamp(std::nearbyint(x[i] / scale), -127.0f, 127.0f);
    const int8_t c = static_cast<int8_t>(q);
    std::memcpy(codes + i, &c, 1);
  }
}

float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

int64_t LatentCodeBytes(KvLatentFormat f, int64_t dim) { return f == KvLatentFormat::kBf16 ? 2 * dim : dim; }

int64_t LatentScaleBytes(KvLatentFormat f, int64_t dim) {
  switch (f) {
    case KvLatentFormat::kFp8Blockwise: return dim / kFp8BlockSize * 4;
    case KvLatentFormat::kInt8PerToken: return 4;
    case KvLatentFormat::kBf16: return 0;
  }
  return 0;
}

void EncodeLatent(KvLatentFormat f, const float* x, int64_t dim, uint8_t* codes, uint8_t* scales) {
  switch (f) {
    case KvLatentFormat::kFp8Blockwise: {
      float s[64];  // dim / 128 scales; the real model has 4
      for (int64_t b = 0; b < dim / kFp8BlockSize; b += 64) {
        const int64_t nb = std::min<int64_t>(64, dim / kFp8BlockSize - b);
        ActQuantFp8(x + b * kFp8BlockSize, nb * kFp8BlockSize, codes + b * kFp8BlockSize, s);
        std::memcpy(scales + b * 4, s, static_cast<size_t>(nb) * 4);
      }
      return;
    }
    case KvLatentFormat::kBf16:
      for (int64_t i = 0; i < dim; ++i) {
        const uint16_t b = F32ToBf16Bits(x[i]);
        std::memcpy(codes + 2 * i, &b, 2);
      }
      return;
    case KvLatentFormat::kInt8PerToken: {
      const float s = Int8Scale(x, dim);
      QuantInt8(x, dim, s, codes);
      std::memcpy(scales, &s, 4);
      return;
    }
  }
}

void EncodeIndexKey(KvIndexFormat f, const float* x, int64_t dim, uint8_t* codes, uint8_t* scale) {
  float s;
  if (f == KvIndexFormat::kFp8) {
    ActQuantFp8(x, dim, codes, &s);
  } else {
    s = Int8Scale(x, dim);
    QuantInt8(x, dim, s, codes);
  }
  std::memcpy(scale, &s, 4);
}

void GatherLatent(const KvTokenView& kv, const int32_t* sel, int64_t n, float* c_out, float* kpe_out) {
  const float* table = Fp8E4M3DecodeTable();
  const int64_t dim = kv.latent_dim;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t t = sel[j];
    const uint8_t* codes = kv.Field(t, kv.latent_offset, kv.latent_stride);
    float* c = c_out + j * dim;
    switch (kv.latent_format) {
      case KvLatentFormat::kFp8Blockwise: {
        const uint8_t* scales = kv.Field(t, kv.latent_scale_offset, kv.latent_scale_stride);
        for (int64_t b = 0; b < dim / kFp8BlockSize; ++b) {
          const float s = LoadF32(scales + 4 * b);
          for (int64_t i = 0; i < kFp8BlockSize; ++i) c[b * kFp8BlockSize + i] = table[codes[b * kFp8BlockSize + i]] * s;
        }
        break;
      }
      case KvLatentFormat::kBf16:
        for (int64_t i = 0; i < dim; ++i) {
          uint16_t b;
          std::memcpy(&b, codes + 2 * i, 2);
          c[i] = Bf16ToF32(b);
        }
        break;
      case KvLatentFormat::kInt8PerToken: {
        const float s = LoadF32(kv.Field(t, kv.latent_scale_offset, kv.latent_scale_stride));
        for (int64_t i = 0; i < dim; ++i) c[i] = static_cast<float>(static_cast<int8_t>(codes[i])) * s;
        break;
      }
    }
    const uint8_t* kpe = kv.Field(t, kv.kpe_offset, kv.kpe_stride);
    for (int64_t i = 0; i < kv.rope_dim; ++i) {
      uint16_t b;
      std::memcpy(&b, kpe + 2 * i, 2);
      kpe_out[j * kv.rope_dim + i] = Bf16ToF32(b);
    }
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

namespace {

// Exact dot of two double vectors whose every product and partial sum is exactly representable
// (fp8 x fp8 or fp8 x int8 values): any summation order gives the same double.
double ExactDot(const double* a, const double* b, int64_t n) {
#if defined(__AVX2__)
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  for (int64_t i = 0; i < n; i += 8) {
    acc0 = _mm256_fmadd_pd(_mm256_loadu_pd(a + i), _mm256_loadu_pd(b + i), acc0);
    acc1 = _mm256_fmadd_pd(_mm256_loadu_pd(a + i + 4), _mm256_loadu_pd(b + i + 4), acc1);
  }
  acc0 = _mm256_add_pd(acc0, acc1);
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, acc0);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#else
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
#endif
}

}  // namespace

void IndexerScores(const KvTokenView& kv, const double* q_decoded, const float* w, int64_t n_heads,
                   int64_t key_begin, int64_t key_end, float* scores) {
  const int64_t dim = kv.index_dim;
  const float* table = Fp8E4M3DecodeTable();
  const bool int8_keys = kv.index_format == KvIndexFormat::kInt8;
  // Each key is decoded to double once and reused by every head; products and sums stay exact.
  alignas(32) double key[256];
  PDSERVE_DCHECK(dim <= 256);
  for (int64_t t = key_begin; t < key_end; ++t) {
    const uint8_t* k = kv.Field(t, kv.idx_k_offset, kv.idx_k_stride);
    if (int8_keys) {
      for (int64_t i = 0; i < dim; ++i) key[i] = static_cast<int8_t>(k[i]);
    } else {
      for (int64_t i = 0; i < dim; ++i) key[i] = table[k[i]];
    }
    float acc = 0.0f;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float dot = static_cast<float>(ExactDot(q_decoded + h * dim, key, dim));
      acc += std::max(dot, 0.0f) * w[h];
    }
    scores[t] = acc * LoadF32(kv.Field(t, kv.idx_scale_offset, kv.idx_scale_stride));
  }
}

}  // namespace pdserve::kernels
