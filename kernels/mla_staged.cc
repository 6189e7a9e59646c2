// Staged sparse attention (kernels/mla_attention.h: LatentStage, StageLatent,
// StagedAttentionHeads): the selected keys' latent is copied once into a compact per-thread
// stage in a format the compute reads directly (bf16 for the fp8 and bf16 caches, which hold
// bf16-exact values; fp32 for C8), and every head reads it from there.
//
// Numerics (bitwise those of AbsorbedAttentionHeads over GatherLatent, on every ISA):
//   score dots: DotF32's order, i.e. 16 lanes (lane l sums elements 16m + l in order, one fma
//     each), then (lanes l + l + 8), then the 128-bit halves, (0 + 2, 1 + 3), (0 + 1);
//   outputs: one fma chain per output element over the keys in order, from zero.
// The AVX-512 variant holds a score accumulator in one zmm (the two ymm of AVX2 side by side)
// and 16 output columns per zmm; both run the same chains.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/check.h"
#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/fp8_quant.h"
#include "kernels/gemm_simd.h"
#include "kernels/isa.h"
#include "kernels/kernel_table.h"
#include "kernels/mla_attention.h"

// GCC 12 flags the deliberately undefined upper lanes inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve::kernels {

namespace {

float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// The AVX-512 variants run when the active kernel table's level (kernels/isa.h: the CPU, or
// PDSERVE_ISA forced lower; tests switch it with TEST_SetActiveIsa) includes AVX-512.
bool UseAvx512() { return internal::ActiveTable().isa >= Isa::kAvx512; }

// ---- AVX2 -----------------------------------------------------------------------------------

// 8 staged values from element i of a row (bf16 widened exactly, or fp32).
template <bool kBf16>
inline __m256 Load8(const void* row, int64_t i) {
  if constexpr (kBf16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  }
}

// DotF32's reduction: the two accumulators added, then internal::Hsum8's tree.
inline float ReduceLikeDotF32(__m256 acc0, __m256 acc1) { return internal::Hsum8(_mm256_add_ps(acc0, acc1)); }

// out[h * ldo + k] = DotF32(q + h * ldq, key k, dim) for HB heads and KB keys (rows of the
// stage, `ldk` elements apart). REQUIRES dim % 16 == 0.
template <bool kBf16, int KB, int HB>
inline void DotBlockAvx2(const float* q, int64_t ldq, const void* keys, int64_t ldk, int64_t dim, float* out,
                         int64_t ldo) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* kb = static_cast<const uint8_t*>(keys);
  __m256 a0[HB][KB], a1[HB][KB];
  for (int h = 0; h < HB; ++h)
    for (int k = 0; k < KB; ++k) a0[h][k] = a1[h][k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 16) {
    __m256 c0[KB], c1[KB];
    for (int k = 0; k < KB; ++k) {
      const void* row = kb + static_cast<size_t>(k * ldk) * esz;
      c0[k] = Load8<kBf16>(row, i);
      c1[k] = Load8<kBf16>(row, i + 8);
    }
    for (int h = 0; h < HB; ++h) {
      const __m256 q0 = _mm256_loadu_ps(q + h * ldq + i), q1 = _mm256_loadu_ps(q + h * ldq + i + 8);
      for (int k = 0; k < KB; ++k) {
        a0[h][k] = _mm256_fmadd_ps(q0, c0[k], a0[h][k]);
        a1[h][k] = _mm256_fmadd_ps(q1, c1[k], a1[h][k]);
      }
    }
  }
  for (int h = 0; h < HB; ++h)
    for (int k = 0; k < KB; ++k) out[h * ldo + k] = ReduceLikeDotF32(a0[h][k], a1[h][k]);
}

// s[h * n + j] = DotF32(q[h], row j) for all heads and keys [0, n).
template <bool kBf16>
void DotsAvx2(const float* q, int64_t ldq, int64_t n_heads, const void* rows, int64_t dim, int64_t n, float* s) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* base = static_cast<const uint8_t*>(rows);
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    const void* r = base + static_cast<size_t>(j * dim) * esz;
    int64_t h = 0;
    for (; h + 2 <= n_heads; h += 2) DotBlockAvx2<kBf16, 2, 2>(q + h * ldq, ldq, r, dim, dim, s + h * n + j, n);
    for (; h < n_heads; ++h) DotBlockAvx2<kBf16, 2, 1>(q + h * ldq, ldq, r, dim, dim, s + h * n + j, n);
  }
  for (; j < n; ++j) {
    const void* r = base + static_cast<size_t>(j * dim) * esz;
    int64_t h = 0;
    for (; h + 4 <= n_heads; h += 4) DotBlockAvx2<kBf16, 1, 4>(q + h * ldq, ldq, r, dim, dim, s + h * n + j, n);
    for (; h < n_heads; ++h) DotBlockAvx2<kBf16, 1, 1>(q + h * ldq, ldq, r, dim, dim, s + h * n + j, n);
  }
}

// o[h][i0, i0 + 8V) = sum_j p[h * n + j] * row_j[i0, ...) over j ascending from zero, HB heads.
template <bool kBf16, int HB, int V>
inline void AccumulateAvx2(const float* p, int64_t n, const void* rows, int64_t dim, int64_t i0, float* o,
                           int64_t ldo) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* base = static_cast<const uint8_t*>(rows);
  __m256 acc[HB][V];
  for (int h = 0; h < HB; ++h)
    for (int v = 0; v < V; ++v) acc[h][v] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const void* row = base + static_cast<size_t>(j * dim) * esz;
    __m256 c[V];
    for (int v = 0; v < V; ++v) c[v] = Load8<kBf16>(row, i0 + 8 * v);
    for (int h = 0; h < HB; ++h) {
      const __m256 w = _mm256_broadcast_ss(p + h * n + j);
      for (int v = 0; v < V; ++v) acc[h][v] = _mm256_fmadd_ps(w, c[v], acc[h][v]);
    }
  }
  for (int h = 0; h < HB; ++h)
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(o + h * ldo + i0 + 8 * v, acc[h][v]);
}

template <bool kBf16>
void OutputsAvx2(const float* p, int64_t n_heads, int64_t n, const void* rows, int64_t dim, float* o, int64_t ldo) {
  for (int64_t i = 0; i < dim; i += 16) {
    int64_t h = 0;
    for (; h + 4 <= n_heads; h += 4) AccumulateAvx2<kBf16, 4, 2>(p + h * n, n, rows, dim, i, o + h * ldo, ldo);
    for (; h < n_heads; ++h) AccumulateAvx2<kBf16, 1, 2>(p + h * n, n, rows, dim, i, o + h * ldo, ldo);
  }
}

// ---- AVX-512 --------------------------------------------------------------------------------

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

template <bool kBf16>
inline __m512 Load16(const void* row, int64_t i) {
  if constexpr (kBf16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(row) + i);
  }
}

// DotF32's reduction of the 16 lanes (lane l = acc0 lane l for l < 8, acc1 lane l - 8).
inline float Reduce16LikeDotF32(__m512 a) {
  const __m256 v = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Reduce16LikeDotF32 of 16 accumulators at once, bit for bit: the same pairwise additions
// (lanes l + l+8, then the 128-bit halves, then (0 + 2, 1 + 3), then (0 + 1)), done for all 16
// by a transposing butterfly: 45 shuffles and adds instead of 16 x 8 mostly serial ones.
// a[i] is accumulator i; returns r with r[i] = Reduce16LikeDotF32(a[i]).
inline __m512 Reduce16x16LikeDotF32(const __m512* a) {
  __m512 v[8], w[4], x[2];
  for (int p = 0; p < 8; ++p)  // [v(2p) | v(2p+1)], v(l) = a[l] + a[l + 8]
    v[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
  for (int p = 0; p < 4; ++p)  // 128-bit lane i: w of accumulator 4p + i, w(l) = v(l) + v(l + 4)
    w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xDD));
  for (int p = 0; p < 2; ++p)  // lane i: x0, x1 of accumulator 8p + i, then of 8p + 4 + i
    x[p] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * p], w[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * p], w[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // lane i, element e: x0 + x1 of accumulator 4e + i; then into accumulator order.
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

template <bool kBf16, int KB, int HB>
inline void DotBlock512(const float* q, int64_t ldq, const void* keys, int64_t ldk, int64_t dim, float* out,
                        int64_t ldo) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* kb = static_cast<const uint8_t*>(keys);
  __m512 acc[HB][KB];
  for (int h = 0; h < HB; ++h)
    for (int k = 0; k < KB; ++k) acc[h][k] = _mm512_setzero_ps();
  for (int64_t i = 0; i < dim; i += 16) {
    __m512 c[KB];
    for (int k = 0; k < KB; ++k) c[k] = Load16<kBf16>(kb + static_cast<size_t>(k * ldk) * esz, i);
    for (int h = 0; h < HB; ++h) {
      const __m512 qv = _mm512_loadu_ps(q + h * ldq + i);
      for (int k = 0; k < KB; ++k) acc[h][k] = _mm512_fmadd_ps(qv, c[k], acc[h][k]);
    }
  }
  if constexpr (HB == 4 && KB == 4) {
    const __m512 r = Reduce16x16LikeDotF32(&acc[0][0]);  // r[4h + k]
    _mm_storeu_ps(out, _mm512_extractf32x4_ps(r, 0));
    _mm_storeu_ps(out + ldo, _mm512_extractf32x4_ps(r, 1));
    _mm_storeu_ps(out + 2 * ldo, _mm512_extractf32x4_ps(r, 2));
    _mm_storeu_ps(out + 3 * ldo, _mm512_extractf32x4_ps(r, 3));
  } else {
    for (int h = 0; h < HB; ++h)
      for (int k = 0; k < KB; ++k) out[h * ldo + k] = Reduce16LikeDotF32(acc[h][k]);
  }
}

template <bool kBf16>
void Dots512(const float* q, int64_t ldq, int64_t n_heads, const void* rows, int64_t dim, int64_t n, float* s) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* base = static_cast<const uint8_t*>(rows);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const void* r = base + static_cast<size_t>(j * dim) * esz;
    int64_t h = 0;
    for (; h + 4 <= n_heads; h += 4) DotBlock512<kBf16, 4, 4>(q + h * ldq, ldq, r, dim, dim, s + h * n + j, n);
    for (; h < n_heads; ++h) DotBlock512<kBf16, 4, 1>(q + h * ldq, ldq, r, dim, dim, s + h * n + j, n);
  }
  for (; j < n; ++j) {
    const void* r = base + static_cast<size_t>(j * dim) * esz;
    int64_t h = 0;
    for (; h + 4 <= n_heads; h += 4) DotBlock512<kBf16, 1, 4>(q + h * ldq, ldq, r, dim, dim, s + h * n + j, n);
    for (; h < n_heads; ++h) DotBlock512<kBf16, 1, 1>(q + h * ldq, ldq, r, dim, dim, s + h * n + j, n);
  }
}

template <bool kBf16, int HB, int V>
inline void Accumulate512(const float* p, int64_t n, const void* rows, int64_t dim, int64_t i0, float* o,
                          int64_t ldo) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* base = static_cast<const uint8_t*>(rows);
  __m512 acc[HB][V];
  for (int h = 0; h < HB; ++h)
    for (int v = 0; v < V; ++v) acc[h][v] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const void* row = base + static_cast<size_t>(j * dim) * esz;
    __m512 c[V];
    for (int v = 0; v < V; ++v) c[v] = Load16<kBf16>(row, i0 + 16 * v);
    for (int h = 0; h < HB; ++h) {
      const __m512 w = _mm512_set1_ps(p[h * n + j]);
      for (int v = 0; v < V; ++v) acc[h][v] = _mm512_fmadd_ps(w, c[v], acc[h][v]);
    }
  }
  for (int h = 0; h < HB; ++h)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(o + h * ldo + i0 + 16 * v, acc[h][v]);
}

template <bool kBf16>
void Outputs512(const float* p, int64_t n_heads, int64_t n, const void* rows, int64_t dim, float* o, int64_t ldo) {
  // Blocks of 16 heads x 16 columns first: one key load and conversion feeds 16 FMAs (8 x 32
  // feeds 8 per conversion); 1.25-1.3x the 8 x 32 blocks in a same-process A/B at 16 x 512 x 512.
  const int64_t h16 = n_heads / 16 * 16;
  for (int64_t h = 0; h < h16; h += 16)
    for (int64_t i = 0; i < dim; i += 16) Accumulate512<kBf16, 16, 1>(p + h * n, n, rows, dim, i, o + h * ldo, ldo);
  p += h16 * n;
  o += h16 * ldo;
  n_heads -= h16;
  for (int64_t i = 0; n_heads > 0 && i < dim; i += 32) {
    int64_t h = 0;
    for (; h + 8 <= n_heads; h += 8) Accumulate512<kBf16, 8, 2>(p + h * n, n, rows, dim, i, o + h * ldo, ldo);
    for (; h + 4 <= n_heads; h += 4) Accumulate512<kBf16, 4, 2>(p + h * n, n, rows, dim, i, o + h * ldo, ldo);
    for (; h < n_heads; ++h) Accumulate512<kBf16, 1, 2>(p + h * n, n, rows, dim, i, o + h * ldo, ldo);
  }
}

#pragma GCC pop_options

template <bool kBf16>
void Dots(const float* q, int64_t ldq, int64_t n_heads, const void* rows, int64_t dim, int64_t n, float* s) {
  if (UseAvx512()) Dots512<kBf16>(q, ldq, n_heads, rows, dim, n, s);
  else DotsAvx2<kBf16>(q, ldq, n_heads, rows, dim, n, s);
}

template <bool kBf16>
void Outputs(const float* p, int64_t n_heads, int64_t n, const void* rows, int64_t dim, float* o, int64_t ldo) {
  if (UseAvx512() && dim % 32 == 0) Outputs512<kBf16>(p, n_heads, n, rows, dim, o, ldo);
  else OutputsAvx2<kBf16>(p, n_heads, n, rows, dim, o, ldo);
}

// x <- bf16(bf16(bf16(x) + bf16(y)) * scale), elementwise (the score's rounding points).
void CombineScores(float* x, const float* y, int64_t n, float scale) {
  int64_t i = 0;
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  // Round to nearest even on the bits (finite inputs: these are sums of finite products).
  auto round = [&](__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), mask));
  };
  const __m256 vs = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m256 s = round(_mm256_add_ps(round(_mm256_loadu_ps(x + i)), round(_mm256_loadu_ps(y + i))));
    _mm256_storeu_ps(x + i, round(_mm256_mul_ps(s, vs)));
  }
  for (; i < n; ++i) x[i] = RoundToBf16(RoundToBf16(RoundToBf16(x[i]) + RoundToBf16(y[i])) * scale);
}

// ---- Staging ----------------------------------------------------------------------------------

// One fp8 block (kFp8BlockSize e4m3 codes, scale s: a power of two) as bf16 bits. table[code] * s
// is an fp8 value times a power of two: exact in fp32 and in bf16, so its top 16 bits are the
// bf16. Computed as (code / 256) via its fp16 bit pattern, times s * 256 (see GatherLatent).
void Fp8BlockToBf16Avx2(const uint8_t* codes, float s, uint16_t* out) {
  const __m256i x16 = _mm256_set1_epi16(0x7f), s16 = _mm256_set1_epi16(static_cast<short>(0x80));
  const __m256 vs = _mm256_set1_ps(s * 256.0f);
  for (int64_t i = 0; i < kFp8BlockSize; i += 16) {
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, s16), 8),
                                      _mm256_slli_epi16(_mm256_and_si256(x, x16), 7));
    const __m256 lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), vs);
    const __m256 hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), vs);
    // Top halves of the 16 fp32 values, in order.
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(lo), 16),
                                               _mm256_srli_epi32(_mm256_castps_si256(hi), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(packed, 0xd8));
  }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

// Fp8BlockToBf16Avx2's arithmetic, 32 codes at a time.
void Fp8BlockToBf16Avx512(const uint8_t* codes, float s, uint16_t* out) {
  const __m512i x16 = _mm512_set1_epi16(0x7f), s16 = _mm512_set1_epi16(static_cast<short>(0x80));
  const __m512 vs = _mm512_set1_ps(s * 256.0f);
  static_assert(kFp8BlockSize % 32 == 0);
  for (int64_t i = 0; i < kFp8BlockSize; i += 32) {
    const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i)));
    const __m512i h = _mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(x, s16), 8),
                                      _mm512_slli_epi16(_mm512_and_si512(x, x16), 7));
    const __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), vs);
    const __m512 hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), vs);
    // Top halves of the 32 fp32 values: packus interleaves 128-bit lanes (lo0 hi0 lo1 hi1 ...),
    // the permute puts them back in order.
    const __m512i packed = _mm512_packus_epi32(_mm512_srli_epi32(_mm512_castps_si512(lo), 16),
                                               _mm512_srli_epi32(_mm512_castps_si512(hi), 16));
    _mm512_storeu_si512(out + i, _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed));
  }
}

#pragma GCC pop_options

}  // namespace

void PrepareLatentStage(const KvTokenView& kv, int64_t n, LatentStage* stage) {
  stage->n = n;
  stage->latent_dim = kv.latent_dim;
  stage->rope_dim = kv.rope_dim;
  stage->bf16 = kv.latent_format != KvLatentFormat::kInt8PerToken;
  const size_t values = static_cast<size_t>(n * kv.latent_dim);
  if (stage->bf16) {
    if (stage->c16.size() < values) stage->c16.resize(values);
  } else {
    if (stage->c32.size() < values) stage->c32.resize(values);
  }
  if (stage->kpe.size() < static_cast<size_t>(n * kv.rope_dim)) stage->kpe.resize(static_cast<size_t>(n * kv.rope_dim));
}

void StageLatent(const KvTokenView& kv, const int32_t* sel, int64_t begin, int64_t end, LatentStage* stage) {
  const int64_t dim = kv.latent_dim, dr = kv.rope_dim;
  const bool avx512 = UseAvx512();
  for (int64_t j = begin; j < end; ++j) {
    const KvTokenView::Slot at = kv.Locate(sel[j]);
    const uint8_t* codes = kv.At(at, kv.latent_offset, kv.latent_stride);
    std::memcpy(&stage->kpe[static_cast<size_t>(j * dr)], kv.At(at, kv.kpe_offset, kv.kpe_stride),
                static_cast<size_t>(dr) * 2);
    switch (kv.latent_format) {
      case KvLatentFormat::kFp8Blockwise: {
        uint16_t* c = &stage->c16[static_cast<size_t>(j * dim)];
        const uint8_t* scales = kv.At(at, kv.latent_scale_offset, kv.latent_scale_stride);
        for (int64_t b = 0; b < dim / kFp8BlockSize; ++b) {
          const float s = LoadF32(scales + 4 * b);
          if (avx512) Fp8BlockToBf16Avx512(codes + b * kFp8BlockSize, s, c + b * kFp8BlockSize);
          else Fp8BlockToBf16Avx2(codes + b * kFp8BlockSize, s, c + b * kFp8BlockSize);
        }
        break;
      }
      case KvLatentFormat::kBf16:
        std::memcpy(&stage->c16[static_cast<size_t>(j * dim)], codes, static_cast<size_t>(dim) * 2);
        break;
      case KvLatentFormat::kInt8PerToken: {
        const float s = LoadF32(kv.At(at, kv.latent_scale_offset, kv.latent_scale_stride));
        float* c = &stage->c32[static_cast<size_t>(j * dim)];
        for (int64_t i = 0; i < dim; ++i) c[i] = static_cast<float>(static_cast<int8_t>(codes[i])) * s;
        break;
      }
    }
  }
}

void StagedAttentionHeads(const LatentStage& stage, const float* q_lat, int64_t q_lat_stride, const float* q_pe,
                          int64_t q_pe_stride, int64_t n_heads, float scale, float* o_lat, int64_t o_stride,
                          float* scratch) {
  const int64_t n = stage.n, dim = stage.latent_dim, dr = stage.rope_dim;
  PDSERVE_CHECK(n >= 1);
  if (dim % 16 != 0 || dr % 16 != 0) {
    // Odd sizes: the unstaged kernel on an fp32 copy (the same arithmetic by construction).
    std::vector<float> c(static_cast<size_t>(n * dim)), kpe(static_cast<size_t>(n * dr));
    for (int64_t i = 0; i < n * dim; ++i) c[i] = stage.bf16 ? Bf16ToF32(stage.c16[i]) : stage.c32[i];
    for (int64_t i = 0; i < n * dr; ++i) kpe[i] = Bf16ToF32(stage.kpe[i]);
    AbsorbedAttentionHeads(q_lat, q_lat_stride, q_pe, q_pe_stride, n_heads, c.data(), kpe.data(), n, dim, dr, scale,
                           o_lat, o_stride, scratch);
    return;
  }
  // scratch: [n_heads, n] latent scores, then the rope scores behind them.
  float* s = scratch;
  float* s_pe = scratch + n_heads * n;
  if (stage.bf16) Dots<true>(q_lat, q_lat_stride, n_heads, stage.c16.data(), dim, n, s);
  else Dots<false>(q_lat, q_lat_stride, n_heads, stage.c32.data(), dim, n, s);
  Dots<true>(q_pe, q_pe_stride, n_heads, stage.kpe.data(), dr, n, s_pe);
  CombineScores(s, s_pe, n_heads * n, scale);
  for (int64_t h = 0; h < n_heads; ++h) {
    Softmax(s + h * n, n);
    RoundToBf16InPlace(s + h * n, n);
  }
  if (stage.bf16) Outputs<true>(s, n_heads, n, stage.c16.data(), dim, o_lat, o_stride);
  else Outputs<false>(s, n_heads, n, stage.c32.data(), dim, o_lat, o_stride);
  for (int64_t h = 0; h < n_heads; ++h) RoundToBf16InPlace(o_lat + h * o_stride, dim);
}

}  // namespace pdserve::kernels
