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
#include "kernels/gemm_simd.h"
#include "kernels/isa.h"
#include "kernels/kernel_table.h"

// GCC 12 flags the deliberately undefined upper lanes inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

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

#if defined(__AVX2__)
// 16 e4m3 codes -> their values / 256 as two vectors of 8 floats. Shifting a code's exponent
// and mantissa bits into an fp16's places gives an fp16 of value v * 2^-8 (normal and
// subnormal codes alike: both formats have no implicit-bit surprises below their normal
// range), which F16C widens exactly. Valid for every code the quantizers write (NaN codes
// 0x7f / 0xff are never written: they saturate at +-448).
inline void Fp8x16ToF32Div256(const uint8_t* codes, __m256* lo, __m256* hi) {
  const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7f)), 7));
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}
#endif

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
  [[maybe_unused]] const float* table = Fp8E4M3DecodeTable();
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
          const uint8_t* cb = codes + b * kFp8BlockSize;
          float* ob = c + b * kFp8BlockSize;
#if defined(__AVX2__)
          // (code / 256) * (s * 256): one rounding of the same exact product as table[code] * s.
          const __m256 vs = _mm256_set1_ps(s * 256.0f);
          for (int64_t i = 0; i < kFp8BlockSize; i += 16) {
            __m256 lo, hi;
            Fp8x16ToF32Div256(cb + i, &lo, &hi);
            _mm256_storeu_ps(ob + i, _mm256_mul_ps(lo, vs));
            _mm256_storeu_ps(ob + i + 8, _mm256_mul_ps(hi, vs));
          }
#else
          for (int64_t i = 0; i < kFp8BlockSize; ++i) ob[i] = table[cb[i]] * s;
#endif
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

namespace {

#if defined(__AVX2__)
__m256 LoadW8(const void* w, bool bf16, int64_t i) {
  if (!bf16) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  const __m256i w16 = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w16, 16));
}
#endif

float WAt(const void* w, bool bf16, int64_t i) {
  return bf16 ? Bf16ToF32(static_cast<const uint16_t*>(w)[i]) : static_cast<const float*>(w)[i];
}

// out[r][i] = sum over d, in d order, of q[r][d] * w[d][i] (one FMA chain per output).
// Columns go in strips of NV x 8: RB x NV accumulators in registers; a lone row takes wide
// strips (8 chains hide the FMA latency, a strip reads whole cache lines of every w row).
template <int RB, int NV>
void AbsorbStrips(const float* const* q, const uint8_t* w, bool bf16, int64_t w_row_bytes, int64_t n_d,
                  int64_t i_end, int64_t* i_io, float* const* out) {
#if defined(__AVX2__)
  int64_t i = *i_io;
  for (; i + 8 * NV <= i_end; i += 8 * NV) {
    __m256 acc[RB][NV];
    for (int r = 0; r < RB; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    for (int64_t d = 0; d < n_d; ++d) {
      const uint8_t* row = w + d * w_row_bytes;
      __m256 wv[NV];
      for (int v = 0; v < NV; ++v) wv[v] = LoadW8(row, bf16, i + 8 * v);
      for (int r = 0; r < RB; ++r) {
        const __m256 a = _mm256_set1_ps(q[r][d]);
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(a, wv[v], acc[r][v]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out[r] + i + 8 * v, acc[r][v]);
  }
  *i_io = i;
#else
  (void)q, (void)w, (void)bf16, (void)w_row_bytes, (void)n_d, (void)i_end, (void)i_io, (void)out;
#endif
}

#if defined(__AVX2__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// AbsorbStrips with zmm registers: RB rows x NS strips of 32 columns. A bf16 strip is one
// 64-byte load whose dwords hold columns (i + 2m, i + 2m + 1); shifting the low halves up and
// masking the high halves gives the even and the odd columns as two fp32 registers for two
// ALU operations (the AVX2 route widens 8 columns for two). Each output element is still its
// own FMA chain over d ascending from zero, so the bits are AbsorbStrips' (the lanes only
// change places); the stores put the even and odd columns back in order.
template <int RB, int NS, bool kBf16>
void AbsorbStrips512(const float* const* q, const uint8_t* w, int64_t w_row_bytes, int64_t n_d, int64_t i_end,
                     int64_t* i_io, float* const* out) {
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  // Output lanes 0..15 = even/odd pairs (m, 16 + m) of the first 8 m; 16..31 of the last 8.
  const __m512i interleave_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i interleave_hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  int64_t i = *i_io;
  for (; i + 32 * NS <= i_end; i += 32 * NS) {
    __m512 acc[RB][2 * NS];
    for (int r = 0; r < RB; ++r)
      for (int v = 0; v < 2 * NS; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < n_d; ++d) {
      const uint8_t* row = w + d * w_row_bytes;
      __m512 wv[2 * NS];
      for (int s = 0; s < NS; ++s) {
        if constexpr (kBf16) {
          const __m512i x = _mm512_loadu_si512(row + 2 * (i + 32 * s));
          wv[2 * s] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
          wv[2 * s + 1] = _mm512_castsi512_ps(_mm512_and_si512(x, hi_mask));
        } else {
          const float* rf = reinterpret_cast<const float*>(row) + i + 32 * s;
          wv[2 * s] = _mm512_loadu_ps(rf);
          wv[2 * s + 1] = _mm512_loadu_ps(rf + 16);
        }
      }
      for (int r = 0; r < RB; ++r) {
        const __m512 a = _mm512_set1_ps(q[r][d]);
        for (int v = 0; v < 2 * NS; ++v) acc[r][v] = _mm512_fmadd_ps(a, wv[v], acc[r][v]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int s = 0; s < NS; ++s) {
        float* o = out[r] + i + 32 * s;
        if constexpr (kBf16) {
          _mm512_storeu_ps(o, _mm512_permutex2var_ps(acc[r][2 * s], interleave_lo, acc[r][2 * s + 1]));
          _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(acc[r][2 * s], interleave_hi, acc[r][2 * s + 1]));
        } else {
          _mm512_storeu_ps(o, acc[r][2 * s]);
          _mm512_storeu_ps(o + 16, acc[r][2 * s + 1]);
        }
      }
  }
  *i_io = i;
}
#pragma GCC pop_options
#endif

template <int RB>
void AbsorbRows(const float* const* q, const uint8_t* w, bool bf16, int64_t w_row_bytes, int64_t n_d, int64_t dim,
                float* const* out) {
  int64_t i = 0;
#if defined(__AVX2__)
  if (internal::ActiveIsaHasAvx512()) {
    // 16 accumulators (8 for a lone row, which takes 4 strips: every weight row's 256 bytes).
    constexpr int NS = RB >= 8 ? 1 : RB >= 4 ? 2 : 4;
    if (bf16) AbsorbStrips512<RB, NS, true>(q, w, w_row_bytes, n_d, dim, &i, out);
    else AbsorbStrips512<RB, NS, false>(q, w, w_row_bytes, n_d, dim, &i, out);
    if constexpr (NS > 1) {
      if (bf16) AbsorbStrips512<RB, 1, true>(q, w, w_row_bytes, n_d, dim, &i, out);
      else AbsorbStrips512<RB, 1, false>(q, w, w_row_bytes, n_d, dim, &i, out);
    }
  }
#endif
  if constexpr (RB == 1) AbsorbStrips<1, 8>(q, w, bf16, w_row_bytes, n_d, dim, &i, out);
  AbsorbStrips<RB, 2>(q, w, bf16, w_row_bytes, n_d, dim, &i, out);
  AbsorbStrips<RB, 1>(q, w, bf16, w_row_bytes, n_d, dim, &i, out);
  for (; i < dim; ++i)
    for (int r = 0; r < RB; ++r) {
      float y = 0.0f;
      for (int64_t d = 0; d < n_d; ++d) y += q[r][d] * WAt(w + d * w_row_bytes, bf16, i);
      out[r][i] = y;
    }
}

}  // namespace

void AbsorbQueries(const float* const* q_rows, int64_t n_rows, const void* w, bool w_bf16, int64_t w_ld, int64_t n_d,
                   int64_t dim, float* const* out_rows) {
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const int64_t row_bytes = w_ld * (w_bf16 ? 2 : 4);
  if (dim % 8 != 0) {  // scalar tails: the AxpyRow loop itself
    for (int64_t r = 0; r < n_rows; ++r) {
      std::fill(out_rows[r], out_rows[r] + dim, 0.0f);
      for (int64_t d = 0; d < n_d; ++d) AxpyRow(q_rows[r][d], wb + d * row_bytes, w_bf16, dim, out_rows[r]);
    }
    return;
  }
  int64_t r = 0;
  if (internal::ActiveIsaHasAvx512())
    for (; r + 8 <= n_rows; r += 8) AbsorbRows<8>(q_rows + r, wb, w_bf16, row_bytes, n_d, dim, out_rows + r);
  for (; r + 4 <= n_rows; r += 4) AbsorbRows<4>(q_rows + r, wb, w_bf16, row_bytes, n_d, dim, out_rows + r);
  for (; r < n_rows; ++r) AbsorbRows<1>(q_rows + r, wb, w_bf16, row_bytes, n_d, dim, out_rows + r);
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

#if defined(__AVX2__)
// The horizontal reduction DotF32 (kernels/elementwise.cc) ends with, in the same order.
float ReduceLikeDotF32(__m256 acc0, __m256 acc1) {
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#endif

// out[h] = DotF32(a + h * lda, b, n) for h < HB, bitwise: same chains, reduction and tail.
template <int HB>
void DotF32Heads(const float* a, int64_t lda, const float* b, int64_t n, float* out) {
#if defined(__AVX2__)
  __m256 acc0[HB], acc1[HB];
  for (int h = 0; h < HB; ++h) acc0[h] = acc1[h] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 b0 = _mm256_loadu_ps(b + i), b1 = _mm256_loadu_ps(b + i + 8);
    for (int h = 0; h < HB; ++h) {
      acc0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(a + h * lda + i), b0, acc0[h]);
      acc1[h] = _mm256_fmadd_ps(_mm256_loadu_ps(a + h * lda + i + 8), b1, acc1[h]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 b0 = _mm256_loadu_ps(b + i);
    for (int h = 0; h < HB; ++h) acc0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(a + h * lda + i), b0, acc0[h]);
  }
  for (int h = 0; h < HB; ++h) {
    float sum = ReduceLikeDotF32(acc0[h], acc1[h]);
    for (int64_t k = i; k < n; ++k) sum += a[h * lda + k] * b[k];
    out[h] = sum;
  }
#else
  for (int h = 0; h < HB; ++h) out[h] = DotF32(a + h * lda, b, n);
#endif
}

// o[h][i, i + W) = sum_j p[h * ldp + j] * c_j[i, i + W) over j ascending, as repeated Axpy
// calls accumulate it (one fma per element per j, from zero), for HB heads; W = 8 * V.
template <int HB, int V>
void AccumulateBlock(const float* p, int64_t ldp, const float* c, int64_t n, int64_t dim, int64_t i, float* o,
                     int64_t ldo) {
#if defined(__AVX2__)
  __m256 acc[HB][V];
  for (int h = 0; h < HB; ++h)
    for (int v = 0; v < V; ++v) acc[h][v] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m256 cv[V];
    for (int v = 0; v < V; ++v) cv[v] = _mm256_loadu_ps(c + j * dim + i + 8 * v);
    for (int h = 0; h < HB; ++h) {
      const __m256 w = _mm256_broadcast_ss(p + h * ldp + j);
      for (int v = 0; v < V; ++v) acc[h][v] = _mm256_fmadd_ps(w, cv[v], acc[h][v]);
    }
  }
  for (int h = 0; h < HB; ++h)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(o + h * ldo + i + 8 * v, acc[h][v]);
#endif
}

template <int V>
void AccumulateAllHeads(const float* p, int64_t n_heads, const float* c, int64_t n, int64_t dim, int64_t i, float* o,
                        int64_t ldo) {
  int64_t h = 0;
  for (; h + 4 <= n_heads; h += 4) AccumulateBlock<4, V>(p + h * n, n, c, n, dim, i, o + h * ldo, ldo);
  for (; h < n_heads; ++h) AccumulateBlock<1, V>(p + h * n, n, c, n, dim, i, o + h * ldo, ldo);
}

template <int HB>
void ScoreHeads(const float* q_lat, int64_t q_lat_stride, const float* q_pe, int64_t q_pe_stride, const float* c_j,
                const float* kpe_j, int64_t latent_dim, int64_t rope_dim, float scale, float* p, int64_t ldp) {
  float s_lat[HB], s_pe[HB];
  DotF32Heads<HB>(q_lat, q_lat_stride, c_j, latent_dim, s_lat);
  DotF32Heads<HB>(q_pe, q_pe_stride, kpe_j, rope_dim, s_pe);
  for (int h = 0; h < HB; ++h) p[h * ldp] = RoundToBf16(RoundToBf16(RoundToBf16(s_lat[h]) + RoundToBf16(s_pe[h])) * scale);
}

}  // namespace

void AbsorbedAttentionHeads(const float* q_lat, int64_t q_lat_stride, const float* q_pe, int64_t q_pe_stride,
                            int64_t n_heads, const float* c, const float* kpe, int64_t n, int64_t latent_dim,
                            int64_t rope_dim, float scale, float* o_lat, int64_t o_stride, float* scratch) {
#if defined(__AVX2__)
  constexpr bool kVector = true;
#else
  constexpr bool kVector = false;
#endif
  if (!kVector || latent_dim % 8 != 0 || rope_dim % 8 != 0) {
    // Scalar tails: use the per-head kernel itself, so the arithmetic is the same by construction.
    for (int64_t h = 0; h < n_heads; ++h)
      AbsorbedAttentionHead(q_lat + h * q_lat_stride, q_pe + h * q_pe_stride, c, kpe, n, latent_dim, rope_dim, scale,
                            o_lat + h * o_stride, scratch);
    return;
  }
  // Scores key by key (each gathered token is read once, all head groups use it from L1).
  for (int64_t j = 0; j < n; ++j) {
    int64_t h = 0;
    for (; h + 4 <= n_heads; h += 4)
      ScoreHeads<4>(q_lat + h * q_lat_stride, q_lat_stride, q_pe + h * q_pe_stride, q_pe_stride, c + j * latent_dim,
                    kpe + j * rope_dim, latent_dim, rope_dim, scale, scratch + h * n + j, n);
    for (; h < n_heads; ++h)
      ScoreHeads<1>(q_lat + h * q_lat_stride, q_lat_stride, q_pe + h * q_pe_stride, q_pe_stride, c + j * latent_dim,
                    kpe + j * rope_dim, latent_dim, rope_dim, scale, scratch + h * n + j, n);
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    Softmax(scratch + h * n, n);
    RoundToBf16InPlace(scratch + h * n, n);
  }
  // Outputs block by block of the latent (a block's column of c stays in L1 for every head).
  int64_t i = 0;
  for (; i + 16 <= latent_dim; i += 16) AccumulateAllHeads<2>(scratch, n_heads, c, n, latent_dim, i, o_lat, o_stride);
  for (; i < latent_dim; i += 8) AccumulateAllHeads<1>(scratch, n_heads, c, n, latent_dim, i, o_lat, o_stride);
  for (int64_t h = 0; h < n_heads; ++h) RoundToBf16InPlace(o_lat + h * o_stride, latent_dim);
}

namespace {

// dots[k * n_heads_total + h] = exact (q[h] . key[k]) for HB heads and KB keys at once: one
// accumulator per pair (the sums are exact, so chain order does not matter), which keeps
// 12 FMA chains in flight and loads each operand vector once per block.
template <int KB, int HB>
void ExactDots(const double* q, int64_t dim, const double* keys, int64_t h0, int64_t n_heads_total, float* dots) {
#if defined(__AVX2__)
  __m256d acc[KB][HB];
  for (int k = 0; k < KB; ++k)
    for (int h = 0; h < HB; ++h) acc[k][h] = _mm256_setzero_pd();
  for (int64_t i = 0; i < dim; i += 4) {
    __m256d kv[KB];
    for (int k = 0; k < KB; ++k) kv[k] = _mm256_loadu_pd(keys + k * dim + i);
    for (int h = 0; h < HB; ++h) {
      const __m256d qv = _mm256_loadu_pd(q + h * dim + i);
      for (int k = 0; k < KB; ++k) acc[k][h] = _mm256_fmadd_pd(qv, kv[k], acc[k][h]);
    }
  }
  for (int k = 0; k < KB; ++k)
    for (int h = 0; h < HB; ++h) {
      alignas(32) double l[4];
      _mm256_store_pd(l, acc[k][h]);
      dots[k * n_heads_total + h0 + h] = static_cast<float>((l[0] + l[1]) + (l[2] + l[3]));
    }
#else
  for (int k = 0; k < KB; ++k)
    for (int h = 0; h < HB; ++h) {
      double s = 0.0;
      for (int64_t i = 0; i < dim; ++i) s += q[h * dim + i] * keys[k * dim + i];
      dots[k * n_heads_total + h0 + h] = static_cast<float>(s);
    }
#endif
}

template <int KB>
void ExactDotsAllHeads(const double* q, int64_t dim, const double* keys, int64_t n_heads, float* dots) {
  int64_t h = 0;
  for (; h + 4 <= n_heads; h += 4) ExactDots<KB, 4>(q + h * dim, dim, keys, h, n_heads, dots);
  for (; h < n_heads; ++h) ExactDots<KB, 1>(q + h * dim, dim, keys, h, n_heads, dots);
}

}  // namespace

void IndexerScores(const KvTokenView& kv, const double* q_decoded, const float* w, int64_t n_heads,
                   int64_t key_begin, int64_t key_end, float* scores) {
  constexpr int kKeys = 3;  // keys per block: 3 keys x 4 heads = 12 accumulators
  const int64_t dim = kv.index_dim;
  const float* table = Fp8E4M3DecodeTable();
  alignas(32) double kd[kKeys * 1024];  // decoded keys (index_dim <= 1024)
  float dots[kKeys * 64];
  for (int64_t t0 = key_begin; t0 < key_end; t0 += kKeys) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeys, key_end - t0));
    for (int k = 0; k < nk; ++k) {
      const uint8_t* code = kv.Field(t0 + k, kv.idx_k_offset, kv.idx_k_stride);
      double* d = kd + k * dim;
      if (kv.index_format == KvIndexFormat::kFp8) {
#if defined(__AVX2__)
        if (dim % 16 == 0) {
          const __m256d k256 = _mm256_set1_pd(256.0);
          for (int64_t i = 0; i < dim; i += 16) {
            __m256 lo, hi;
            Fp8x16ToF32Div256(code + i, &lo, &hi);
            _mm256_storeu_pd(d + i, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(lo)), k256));
            _mm256_storeu_pd(d + i + 4, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)), k256));
            _mm256_storeu_pd(d + i + 8, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(hi)), k256));
            _mm256_storeu_pd(d + i + 12, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)), k256));
          }
          continue;
        }
#endif
        for (int64_t i = 0; i < dim; ++i) d[i] = table[code[i]];
      } else {
        for (int64_t i = 0; i < dim; ++i) d[i] = static_cast<int8_t>(code[i]);
      }
    }
    if (nk == kKeys) ExactDotsAllHeads<kKeys>(q_decoded, dim, kd, n_heads, dots);
    else if (nk == 2) ExactDotsAllHeads<2>(q_decoded, dim, kd, n_heads, dots);
    else ExactDotsAllHeads<1>(q_decoded, dim, kd, n_heads, dots);
    for (int k = 0; k < nk; ++k) {
      const int64_t t = t0 + k;
      float acc = 0.0f;
      // One fused multiply-add per head, in head order (spelled out: contraction is up to the
      // compiler otherwise).
      for (int64_t h = 0; h < n_heads; ++h) acc = std::fma(std::max(dots[k * n_heads + h], 0.0f), w[h], acc);
      scores[t] = acc * LoadF32(kv.Field(t, kv.idx_scale_offset, kv.idx_scale_stride));
    }
  }
}

namespace {

// out[k] = DotF32(a, b[k], n) for KB rows b[k], bit for bit. REQUIRES n % 16 == 0.
template <int KB>
inline void DotsLikeDotF32(const float* a, const float* const* b, int64_t n, float* out) {
  __m256 acc0[KB], acc1[KB];
  for (int k = 0; k < KB; ++k) acc0[k] = acc1[k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
    for (int k = 0; k < KB; ++k) {
      acc0[k] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b[k] + i), acc0[k]);
      acc1[k] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b[k] + i + 8), acc1[k]);
    }
  }
  // DotF32's reduction: the two accumulators added, then internal::Hsum8's tree.
  for (int k = 0; k < KB; ++k) out[k] = internal::Hsum8(_mm256_add_ps(acc0[k], acc1[k]));
}

// o[i0, i0 + 8V) = sum_j p[j] * v_j[i0, ...), one fma chain per element from zero.
template <int V>
inline void AccumulateExpanded(const float* p, const float* kv, int64_t kv_stride, const int32_t* sel, int64_t n,
                               int64_t i0, float* o) {
  __m256 acc[V];
  for (int v = 0; v < V; ++v) acc[v] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const float* row = kv + sel[j] * kv_stride + i0;
    const __m256 w = _mm256_broadcast_ss(p + j);
    for (int v = 0; v < V; ++v) acc[v] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * v), acc[v]);
  }
  for (int v = 0; v < V; ++v) _mm256_storeu_ps(o + i0 + 8 * v, acc[v]);
}

}  // namespace

void ExpandedAttentionHead(const float* q, const float* kv, int64_t kv_stride, const float* kpe, const int32_t* sel,
                           int64_t n, int64_t dn, int64_t dr, int64_t dv, float scale, float* o, float* scratch) {
  float* p = scratch;
  if (dn % 16 != 0 || dr % 16 != 0) {
    // Odd sizes: the plain loop (what the blocked code below reproduces).
    for (int64_t j = 0; j < n; ++j) {
      const float dot = DotF32(q, kv + sel[j] * kv_stride, dn) + DotF32(q + dn, kpe + sel[j] * dr, dr);
      p[j] = RoundToBf16(RoundToBf16(dot) * scale);
    }
  } else {
    constexpr int KB = 4;
    int64_t j = 0;
    float nope[KB], rope[KB];
    for (; j + KB <= n; j += KB) {
      const float* k[KB];
      const float* r[KB];
      for (int b = 0; b < KB; ++b) {
        k[b] = kv + sel[j + b] * kv_stride;
        r[b] = kpe + sel[j + b] * dr;
      }
      DotsLikeDotF32<KB>(q, k, dn, nope);
      DotsLikeDotF32<KB>(q + dn, r, dr, rope);
      for (int b = 0; b < KB; ++b) p[j + b] = RoundToBf16(RoundToBf16(nope[b] + rope[b]) * scale);
    }
    for (; j < n; ++j) {
      const float* k[1] = {kv + sel[j] * kv_stride};
      const float* r[1] = {kpe + sel[j] * dr};
      DotsLikeDotF32<1>(q, k, dn, nope);
      DotsLikeDotF32<1>(q + dn, r, dr, rope);
      p[j] = RoundToBf16(RoundToBf16(nope[0] + rope[0]) * scale);
    }
  }
  SoftmaxToBf16(p, n);
  const float* v = kv + dn;
  if (dv % 8 != 0) {
    std::fill(o, o + dv, 0.0f);
    for (int64_t j = 0; j < n; ++j) Axpy(p[j], v + sel[j] * kv_stride, dv, o);
  } else {
    int64_t i = 0;
    for (; i + 64 <= dv; i += 64) AccumulateExpanded<8>(p, v, kv_stride, sel, n, i, o);
    for (; i < dv; i += 8) AccumulateExpanded<1>(p, v, kv_stride, sel, n, i, o);
  }
  RoundToBf16InPlace(o, dv);
}

}  // namespace pdserve::kernels
