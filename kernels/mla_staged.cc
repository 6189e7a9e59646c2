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
// and 16 output columns per zmm; both run the same chains. bf16 stages are in the paired
// layout (kernels/mla_attention.h), which feeds these chains in the same order: a group of 32
// values gives lane l value 32c + l (low halves), then value 32c + 16 + l (high halves).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <climits>
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

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include "kernels/avx512_transpose.h"  // its one inline function, compiled for AVX-512
#pragma GCC pop_options

// GCC 12 flags the deliberately undefined upper lanes inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve::kernels {

namespace internal {
std::atomic<bool> staging_byte_tables{true};
}  // namespace internal

namespace {

float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// The AVX-512 variants run when the active kernel table's level (kernels/isa.h: the CPU, or
// PDSERVE_ISA forced lower; tests switch it with TEST_SetActiveIsa) includes AVX-512
// (internal::ActiveIsaHasAvx512).

// ---- AVX2 -----------------------------------------------------------------------------------
//
// kBf16 rows are in the paired layout (kernels/mla_attention.h): the 8 words [w, w + 8) of a
// group of 32 hold values w.. in their low halves and w + 16.. in their high halves.

inline __m256 LowHalves(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
inline __m256 HighHalves(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline __m256i LoadWords8(const void* row, int64_t u16_index) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + u16_index));
}

// DotF32's reduction: the two accumulators added, then internal::Hsum8's tree.
inline float ReduceLikeDotF32(__m256 acc0, __m256 acc1) { return internal::Hsum8(_mm256_add_ps(acc0, acc1)); }

// out[h * ldo + k] = DotF32(q + h * ldq, key k, dim) for HB heads and KB keys (rows of the
// stage, `ldk` elements apart). DotF32 gives lane l (acc0 lanes 0-7, acc1 lanes 8-15) the
// values 16m + l in order; a paired group of 32 feeds m = 2c from its low halves and m = 2c + 1
// from its high halves. REQUIRES dim % 32 == 0.
template <bool kBf16, int KB, int HB>
inline void DotBlockAvx2(const float* q, int64_t ldq, const void* keys, int64_t ldk, int64_t dim, float* out,
                         int64_t ldo) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* kb = static_cast<const uint8_t*>(keys);
  __m256 a0[HB][KB], a1[HB][KB];
  for (int h = 0; h < HB; ++h)
    for (int k = 0; k < KB; ++k) a0[h][k] = a1[h][k] = _mm256_setzero_ps();
  // One step: acc0 += q[i, i + 8) * c0, acc1 += q[i + 8, i + 16) * c1 for every head and key.
  auto step = [&](const __m256* c0, const __m256* c1, int64_t i) {
    for (int h = 0; h < HB; ++h) {
      const __m256 q0 = _mm256_loadu_ps(q + h * ldq + i), q1 = _mm256_loadu_ps(q + h * ldq + i + 8);
      for (int k = 0; k < KB; ++k) {
        a0[h][k] = _mm256_fmadd_ps(q0, c0[k], a0[h][k]);
        a1[h][k] = _mm256_fmadd_ps(q1, c1[k], a1[h][k]);
      }
    }
  };
  // The low halves' step, then the high halves' (the words are loaded again, from L1: holding
  // them too would need more than the 16 ymm registers).
  for (int64_t i = 0; i < dim; i += 32) {
    for (int half = 0; half < 2; ++half) {
      __m256 c0[KB], c1[KB];
      for (int k = 0; k < KB; ++k) {
        const void* row = kb + static_cast<size_t>(k * ldk) * esz;
        if constexpr (kBf16) {
          const __m256i w0 = LoadWords8(row, i), w1 = LoadWords8(row, i + 16);
          c0[k] = half == 0 ? LowHalves(w0) : HighHalves(w0);
          c1[k] = half == 0 ? LowHalves(w1) : HighHalves(w1);
        } else {
          const float* f = static_cast<const float*>(row);
          c0[k] = _mm256_loadu_ps(f + i + 16 * half), c1[k] = _mm256_loadu_ps(f + i + 16 * half + 8);
        }
      }
      step(c0, c1, i + 16 * half);
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

// o[h][...] = sum_j pt[j * ldp + h] * row_j[...] over j ascending from zero, for HB heads and
// the 16 columns (i0 + d0 + [0, 8)) and (i0 + 16 + d0 + [0, 8)): words [d0, d0 + 8) of the
// paired group at i0 (d0 = 0 or 8). pt is the probabilities transposed (one key's heads
// contiguous).
template <bool kBf16, int HB>
inline void AccumulateAvx2(const float* pt, int64_t ldp, int64_t n, const void* rows, int64_t dim, int64_t i0,
                           int64_t d0, float* o, int64_t ldo) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* base = static_cast<const uint8_t*>(rows);
  __m256 acc[HB][2];
  for (int h = 0; h < HB; ++h) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const void* row = base + static_cast<size_t>(j * dim) * esz;
    __m256 c0, c1;
    if constexpr (kBf16) {
      const __m256i w = LoadWords8(row, i0 + 2 * d0);
      c0 = LowHalves(w), c1 = HighHalves(w);
    } else {
      c0 = _mm256_loadu_ps(static_cast<const float*>(row) + i0 + d0);
      c1 = _mm256_loadu_ps(static_cast<const float*>(row) + i0 + 16 + d0);
    }
    for (int h = 0; h < HB; ++h) {
      const __m256 w = _mm256_broadcast_ss(pt + j * ldp + h);
      acc[h][0] = _mm256_fmadd_ps(w, c0, acc[h][0]);
      acc[h][1] = _mm256_fmadd_ps(w, c1, acc[h][1]);
    }
  }
  for (int h = 0; h < HB; ++h) {
    _mm256_storeu_ps(o + h * ldo + i0 + d0, acc[h][0]);
    _mm256_storeu_ps(o + h * ldo + i0 + 16 + d0, acc[h][1]);
  }
}

template <bool kBf16>
void OutputsAvx2(const float* pt, int64_t n_heads, int64_t n, const void* rows, int64_t dim, float* o, int64_t ldo) {
  for (int64_t i = 0; i < dim; i += 32)
    for (int64_t d0 : {0, 8}) {
      int64_t h = 0;
      for (; h + 4 <= n_heads; h += 4)
        AccumulateAvx2<kBf16, 4>(pt + h, n_heads, n, rows, dim, i, d0, o + h * ldo, ldo);
      for (; h < n_heads; ++h) AccumulateAvx2<kBf16, 1>(pt + h, n_heads, n, rows, dim, i, d0, o + h * ldo, ldo);
    }
}

// ---- AVX-512 --------------------------------------------------------------------------------

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

// The 32 values of the paired group at u16 index i: values [i, i + 16) in *lo, [i + 16, i + 32)
// in *hi (or 32 fp32 values from an fp32 row).
template <bool kBf16>
inline void Load32(const void* row, int64_t i, __m512* lo, __m512* hi) {
  if constexpr (kBf16) {
    const __m512i w = _mm512_loadu_si512(static_cast<const uint16_t*>(row) + i);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  } else {
    *lo = _mm512_loadu_ps(static_cast<const float*>(row) + i);
    *hi = _mm512_loadu_ps(static_cast<const float*>(row) + i + 16);
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

// DotBlockAvx2's chains with one zmm accumulator per (head, key): a paired group of 32 feeds
// lane l value 32c + l, then value 32c + 16 + l. REQUIRES dim % 32 == 0.
template <bool kBf16, int KB, int HB>
inline void DotBlock512(const float* q, int64_t ldq, const void* keys, int64_t ldk, int64_t dim, float* out,
                        int64_t ldo) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* kb = static_cast<const uint8_t*>(keys);
  __m512 acc[HB][KB];
  for (int h = 0; h < HB; ++h)
    for (int k = 0; k < KB; ++k) acc[h][k] = _mm512_setzero_ps();
  for (int64_t i = 0; i < dim; i += 32) {
    __m512 lo[KB], hi[KB];
    for (int k = 0; k < KB; ++k) Load32<kBf16>(kb + static_cast<size_t>(k * ldk) * esz, i, &lo[k], &hi[k]);
    for (int h = 0; h < HB; ++h) {
      const __m512 qv = _mm512_loadu_ps(q + h * ldq + i);
      for (int k = 0; k < KB; ++k) acc[h][k] = _mm512_fmadd_ps(qv, lo[k], acc[h][k]);
    }
    for (int h = 0; h < HB; ++h) {
      const __m512 qv = _mm512_loadu_ps(q + h * ldq + i + 16);
      for (int k = 0; k < KB; ++k) acc[h][k] = _mm512_fmadd_ps(qv, hi[k], acc[h][k]);
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

// Keys of the blocks below, widened once: with bf16 keys every 4-head block widened them again
// (a shift and a mask per 16 values, on the FMA ports).
constexpr int64_t kWidenMaxDim = 1024;

template <bool kBf16>
void Dots512(const float* q, int64_t ldq, int64_t n_heads, const void* rows, int64_t dim, int64_t n, float* s) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* base = static_cast<const uint8_t*>(rows);
  int64_t j = 0;
  if (kBf16 && n_heads > 4 && dim <= kWidenMaxDim) {
    // 4 keys widened to fp32 into an L1 block (the same values in the same places: Load32 of
    // the fp32 block gives what Load32 of the paired row gave), then every head block reads it.
    alignas(64) float widened[4 * kWidenMaxDim];
    for (; j + 4 <= n; j += 4) {
      for (int k = 0; k < 4; ++k) {
        const void* row = base + static_cast<size_t>((j + k) * dim) * esz;
        for (int64_t i = 0; i < dim; i += 32) {
          __m512 lo, hi;
          Load32<true>(row, i, &lo, &hi);
          _mm512_store_ps(widened + k * dim + i, lo);
          _mm512_store_ps(widened + k * dim + i + 16, hi);
        }
      }
      int64_t h = 0;
      for (; h + 4 <= n_heads; h += 4) DotBlock512<false, 4, 4>(q + h * ldq, ldq, widened, dim, dim, s + h * n + j, n);
      for (; h < n_heads; ++h) DotBlock512<false, 4, 1>(q + h * ldq, ldq, widened, dim, dim, s + h * n + j, n);
    }
  }
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

// o[h][i0, i0 + 32) = sum_j pt[j * ldp + h] * row_j[i0, i0 + 32) over j ascending from zero, HB
// heads. One 64-byte load of a paired group feeds 2 * HB FMAs.
template <bool kBf16, int HB>
inline void Accumulate512(const float* pt, int64_t ldp, int64_t n, const void* rows, int64_t dim, int64_t i0,
                          float* o, int64_t ldo) {
  const size_t esz = kBf16 ? 2 : 4;
  const uint8_t* base = static_cast<const uint8_t*>(rows);
  __m512 acc[HB][2];
  for (int h = 0; h < HB; ++h) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m512 lo, hi;
    Load32<kBf16>(base + static_cast<size_t>(j * dim) * esz, i0, &lo, &hi);
    for (int h = 0; h < HB; ++h) {
      const __m512 w = _mm512_set1_ps(pt[j * ldp + h]);
      acc[h][0] = _mm512_fmadd_ps(w, lo, acc[h][0]);
      acc[h][1] = _mm512_fmadd_ps(w, hi, acc[h][1]);
    }
  }
  for (int h = 0; h < HB; ++h) {
    _mm512_storeu_ps(o + h * ldo + i0, acc[h][0]);
    _mm512_storeu_ps(o + h * ldo + i0 + 16, acc[h][1]);
  }
}

template <bool kBf16>
void Outputs512(const float* pt, int64_t n_heads, int64_t n, const void* rows, int64_t dim, float* o, int64_t ldo) {
  // 16 heads x 32 columns is 32 accumulators (a few spill) and still the fastest block: one key
  // load feeds 32 FMAs. One thread, 16 heads x 512 keys x 512 columns: 99 GFLOP/s in the plain
  // layout with strided probabilities, 175 with this one (8-head blocks 155-165).
  int64_t h = 0;
  for (; h + 16 <= n_heads; h += 16)
    for (int64_t i = 0; i < dim; i += 32) Accumulate512<kBf16, 16>(pt + h, n_heads, n, rows, dim, i, o + h * ldo, ldo);
  for (; h + 8 <= n_heads; h += 8)
    for (int64_t i = 0; i < dim; i += 32) Accumulate512<kBf16, 8>(pt + h, n_heads, n, rows, dim, i, o + h * ldo, ldo);
  for (; h + 4 <= n_heads; h += 4)
    for (int64_t i = 0; i < dim; i += 32) Accumulate512<kBf16, 4>(pt + h, n_heads, n, rows, dim, i, o + h * ldo, ldo);
  for (; h < n_heads; ++h)
    for (int64_t i = 0; i < dim; i += 32) Accumulate512<kBf16, 1>(pt + h, n_heads, n, rows, dim, i, o + h * ldo, ldo);
}

// pt[j * n_heads + h] = s[h * n + j] for 16 heads (s rows n apart, pt rows ldp apart): 16 x 16
// blocks through registers, the last n % 16 keys one by one.
void Transpose16Heads(const float* s, int64_t n, float* pt, int64_t ldp) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m512i r[16];
    for (int h = 0; h < 16; ++h) r[h] = _mm512_castps_si512(_mm512_loadu_ps(s + h * n + j));
    Transpose16(r);
    for (int t = 0; t < 16; ++t) _mm512_storeu_si512(pt + (j + t) * ldp, r[t]);
  }
  for (; j < n; ++j)
    for (int h = 0; h < 16; ++h) pt[j * ldp + h] = s[h * n + j];
}

#pragma GCC pop_options

// pt[j * n_heads + h] = s[h * n + j]: the probabilities transposed for the output loop.
void TransposeProbabilities(const float* s, int64_t n_heads, int64_t n, float* pt) {
  if (internal::ActiveIsaHasAvx512() && n_heads % 16 == 0) {
    for (int64_t g = 0; g < n_heads; g += 16) Transpose16Heads(s + g * n, n, pt + g, n_heads);
    return;
  }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t h = 0; h < n_heads; ++h) pt[j * n_heads + h] = s[h * n + j];
}

template <bool kBf16>
void Dots(const float* q, int64_t ldq, int64_t n_heads, const void* rows, int64_t dim, int64_t n, float* s) {
  if (internal::ActiveIsaHasAvx512()) Dots512<kBf16>(q, ldq, n_heads, rows, dim, n, s);
  else DotsAvx2<kBf16>(q, ldq, n_heads, rows, dim, n, s);
}

template <bool kBf16>
void Outputs(const float* pt, int64_t n_heads, int64_t n, const void* rows, int64_t dim, float* o, int64_t ldo) {
  if (internal::ActiveIsaHasAvx512()) Outputs512<kBf16>(pt, n_heads, n, rows, dim, o, ldo);
  else OutputsAvx2<kBf16>(pt, n_heads, n, rows, dim, o, ldo);
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

// Eight e4m3 codes as fp32 values times the block scale (exact: see Fp8BlockToPairedBf16Avx2).
inline __m256 Fp8x8ToF32(const uint8_t* codes, __m256 scale_x256) {
  const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(static_cast<short>(0x80))), 8),
                                 _mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7f)), 7));
  return _mm256_mul_ps(_mm256_cvtph_ps(h), scale_x256);
}

// Words of a paired group from the fp32 values of its low (value d) and high (value 16 + d) halves.
inline __m256i PairWords8(__m256 low_values, __m256 high_values) {
  return _mm256_or_si256(
      _mm256_and_si256(_mm256_castps_si256(high_values), _mm256_set1_epi32(static_cast<int>(0xffff0000u))),
      _mm256_srli_epi32(_mm256_castps_si256(low_values), 16));
}

// One fp8 block (kFp8BlockSize e4m3 codes, scale s: a power of two) as bf16 bits in the paired
// layout. table[code] * s is an fp8 value times a power of two: exact in fp32 and in bf16, so
// its top 16 bits are the bf16. Computed as (code / 256) via its fp16 bit pattern, times
// s * 256 (see GatherLatent).
void Fp8BlockToPairedBf16Avx2(const uint8_t* codes, float s, uint16_t* out) {
  const __m256 vs = _mm256_set1_ps(s * 256.0f);
  static_assert(kFp8BlockSize % 32 == 0);
  for (int64_t i = 0; i < kFp8BlockSize; i += 32) {
    const __m256 v0 = Fp8x8ToF32(codes + i, vs), v1 = Fp8x8ToF32(codes + i + 8, vs);
    const __m256 v2 = Fp8x8ToF32(codes + i + 16, vs), v3 = Fp8x8ToF32(codes + i + 24, vs);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), PairWords8(v0, v2));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), PairWords8(v1, v3));
  }
}

// A bf16 row of `dim` values (dim % 32 == 0) into the paired layout.
void PairBf16Row(const uint16_t* in, int64_t dim, uint16_t* out) {
  for (int64_t i = 0; i < dim; i += 32)
    for (int64_t d0 = 0; d0 < 16; d0 += 8) {
      const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + d0)));
      const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 16 + d0)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 2 * d0), _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)));
    }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

// Fp8BlockToPairedBf16Avx2's arithmetic, 32 codes at a time.
void Fp8BlockToPairedBf16Avx512(const uint8_t* codes, float s, uint16_t* out) {
  const __m512i x16 = _mm512_set1_epi16(0x7f), s16 = _mm512_set1_epi16(static_cast<short>(0x80));
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512 vs = _mm512_set1_ps(s * 256.0f);
  for (int64_t i = 0; i < kFp8BlockSize; i += 32) {
    const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i)));
    const __m512i h = _mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(x, s16), 8),
                                      _mm512_slli_epi16(_mm512_and_si512(x, x16), 7));
    const __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), vs);      // values i + [0, 16)
    const __m512 hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), vs);  // values i + [16, 32)
    const __m512i words = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(hi), high_half),
                                          _mm512_srli_epi32(_mm512_castps_si512(lo), 16));
    _mm512_storeu_si512(out + i, words);
  }
}

#pragma GCC pop_options

// Fp8BlockToPairedBf16Avx512's bits by byte-table lookup on CPUs with AVX512-VBMI, for blocks
// whose scale is 2^e with kTableExponentMin <= e <= kTableExponentMax: the values of the e4m3
// codes (code / 256 by the fp16 route, times 256) run from 2^-9 to 1.875 * 2^8, so each
// value * 2^e is then a normal bf16: the table's bits with e added to the exponent field.
// Zeros (either sign) stay zero. 64 codes take two table lookups, a sign merge, two picks into
// the paired layout and a masked add per output register (~10 shuffle-port operations against
// ~30 for the fp16 route's widen, convert, multiply and repack). One thread, 512 keys of 1024,
// alternating call by call: the stage 43-45 -> 37-39 us with the records in L3, 60-61 -> 57-58
// us from DRAM (there the gather's misses dominate; prefetching 12 or 20 keys ahead instead of
// 6 did not help).
constexpr int kTableExponentMin = -117, kTableExponentMax = 119;

// e when s == 2^e within the table's range, else INT32_MIN.
int TableScaleExponent(float s) {
  uint32_t bits;
  std::memcpy(&bits, &s, 4);
  const int biased = static_cast<int>((bits >> 23) & 0xff);
  if ((bits & 0x807fffffu) != 0 || biased == 0 || biased == 0xff) return INT32_MIN;  // sign, significand, 0, inf
  const int e = biased - 127;
  return e >= kTableExponentMin && e <= kTableExponentMax ? e : INT32_MIN;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")

struct Fp8PairedTables {
  __m512i hi[2], lo[2];  // bf16 bits of the 128 magnitudes' values: high and low bytes
  __m512i pick[2];       // bytes of the paired words of values [0, 32) / [32, 64) from (lo, hi)
};

Fp8PairedTables MakeFp8PairedTables() {
  alignas(64) uint8_t hi[128], lo[128], pick[2][64];
  Fp8MagnitudeBf16Bytes(256.0f, hi, lo);  // the codes' values (the fp16 route's value / 256, x 256)
  PairedWordPicks(pick);
  Fp8PairedTables t;
  for (int i = 0; i < 2; ++i) {
    t.hi[i] = _mm512_load_si512(hi + 64 * i);
    t.lo[i] = _mm512_load_si512(lo + 64 * i);
    t.pick[i] = _mm512_load_si512(pick[i]);
  }
  return t;
}

// REQUIRES: kTableExponentMin <= e <= kTableExponentMax.
void Fp8BlockToPairedBf16Vbmi(const uint8_t* codes, int e, uint16_t* out) {
  static const Fp8PairedTables t = MakeFp8PairedTables();
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i magnitude = _mm512_set1_epi16(0x7fff), add = _mm512_set1_epi16(static_cast<short>(e * 128));
  static_assert(kFp8BlockSize % 64 == 0);
  for (int64_t i = 0; i < kFp8BlockSize; i += 64) {
    const __m512i x = _mm512_loadu_si512(codes + i);
    // hi | (x & sign): the table's high byte with the code's sign bit.
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi[0], x, t.hi[1]), x, sign, 0xF8);
    const __m512i lo = _mm512_permutex2var_epi8(t.lo[0], x, t.lo[1]);
    for (int g = 0; g < 2; ++g) {
      const __m512i words = _mm512_permutex2var_epi8(lo, t.pick[g], hi);
      const __mmask32 nonzero = _mm512_test_epi16_mask(words, magnitude);
      _mm512_storeu_si512(out + i + 32 * g, _mm512_mask_add_epi16(words, nonzero, words, add));
    }
  }
}

#pragma GCC pop_options

bool UseStagingByteTables() {
  static const bool cpu = __builtin_cpu_supports("avx512vbmi");
  return cpu && internal::staging_byte_tables.load(std::memory_order_relaxed);
}

}  // namespace

namespace internal {
bool TEST_SetStagingByteTables(bool on) { return staging_byte_tables.exchange(on); }
}  // namespace internal

void PrepareLatentStage(const KvTokenView& kv, int64_t n, LatentStage* stage) {
  stage->n = n;
  stage->latent_dim = kv.latent_dim;
  stage->rope_dim = kv.rope_dim;
  stage->bf16 = kv.latent_format != KvLatentFormat::kInt8PerToken;
  stage->paired = kv.latent_dim % 32 == 0 && kv.rope_dim % 32 == 0;
  const size_t values = static_cast<size_t>(n * kv.latent_dim);
  if (stage->bf16) {
    if (stage->c16.size() < values) stage->c16.resize(values);
  } else {
    if (stage->c32.size() < values) stage->c32.resize(values);
  }
  if (stage->kpe.size() < static_cast<size_t>(n * kv.rope_dim)) stage->kpe.resize(static_cast<size_t>(n * kv.rope_dim));
}

// Staging gathers keys from all over the pool: each record is a dependent miss (its lines are
// not next to the previous key's), so the loads of key j + kStagePrefetchKeys are started
// while key j decodes.
static constexpr int64_t kStagePrefetchKeys = 6;
static constexpr int64_t kStageSlotRing = 8;
static_assert(kStageSlotRing > kStagePrefetchKeys);

void StageLatent(const KvTokenView& kv, const int32_t* sel, int64_t begin, int64_t end, LatentStage* stage) {
  const int64_t dim = kv.latent_dim, dr = kv.rope_dim;
  const bool avx512 = internal::ActiveIsaHasAvx512(), paired = stage->paired;
  const bool byte_tables = avx512 && UseStagingByteTables();
  const int64_t code_bytes = LatentCodeBytes(kv.latent_format, dim);
  // Slots of keys j .. j + kStagePrefetchKeys, each located once (Locate divides).
  KvTokenView::Slot slots[kStageSlotRing];
  for (int64_t j = begin; j < std::min(end, begin + kStagePrefetchKeys); ++j) slots[j % kStageSlotRing] = kv.Locate(sel[j]);
  for (int64_t j = begin; j < end; ++j) {
    if (j + kStagePrefetchKeys < end) {
      KvTokenView::Slot& ahead = slots[(j + kStagePrefetchKeys) % kStageSlotRing];
      ahead = kv.Locate(sel[j + kStagePrefetchKeys]);
      // Inline on purpose: GCC 12 dropped every call of a static helper holding only these
      // prefetches (no instruction was left in the object).
      const uint8_t* next_codes = kv.At(ahead, kv.latent_offset, kv.latent_stride);
      for (int64_t b = 0; b < code_bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(next_codes + b), _MM_HINT_T0);
      if (kv.latent_scale_stride > 0)
        _mm_prefetch(reinterpret_cast<const char*>(kv.At(ahead, kv.latent_scale_offset, kv.latent_scale_stride)),
                     _MM_HINT_T0);
      const uint8_t* next_kpe = kv.At(ahead, kv.kpe_offset, kv.kpe_stride);
      for (int64_t b = 0; b < dr * 2; b += 64) _mm_prefetch(reinterpret_cast<const char*>(next_kpe + b), _MM_HINT_T0);
    }
    const KvTokenView::Slot at = slots[j % kStageSlotRing];
    const uint8_t* codes = kv.At(at, kv.latent_offset, kv.latent_stride);
    const uint16_t* kpe = reinterpret_cast<const uint16_t*>(kv.At(at, kv.kpe_offset, kv.kpe_stride));
    if (paired) PairBf16Row(kpe, dr, &stage->kpe[static_cast<size_t>(j * dr)]);
    else std::memcpy(&stage->kpe[static_cast<size_t>(j * dr)], kpe, static_cast<size_t>(dr) * 2);
    switch (kv.latent_format) {
      case KvLatentFormat::kFp8Blockwise: {
        uint16_t* c = &stage->c16[static_cast<size_t>(j * dim)];
        const uint8_t* scales = kv.At(at, kv.latent_scale_offset, kv.latent_scale_stride);
        for (int64_t b = 0; b < dim / kFp8BlockSize; ++b) {
          const float s = LoadF32(scales + 4 * b);
          const uint8_t* block = codes + b * kFp8BlockSize;
          uint16_t* out = c + b * kFp8BlockSize;
          if (!paired) {
            for (int64_t i = 0; i < kFp8BlockSize; ++i) out[i] = F32ToBf16Bits(Fp8E4M3ToF32(block[i]) * s);
          } else if (const int e = byte_tables ? TableScaleExponent(s) : INT32_MIN; e != INT32_MIN) {
            Fp8BlockToPairedBf16Vbmi(block, e, out);
          } else if (avx512) {
            Fp8BlockToPairedBf16Avx512(block, s, out);
          } else {
            Fp8BlockToPairedBf16Avx2(block, s, out);
          }
        }
        break;
      }
      case KvLatentFormat::kBf16: {
        uint16_t* c = &stage->c16[static_cast<size_t>(j * dim)];
        if (paired) PairBf16Row(reinterpret_cast<const uint16_t*>(codes), dim, c);
        else std::memcpy(c, codes, static_cast<size_t>(dim) * 2);
        break;
      }
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
  if (!stage.paired) {
    // Odd sizes: the unstaged kernel on an fp32 copy (the same arithmetic by construction).
    std::vector<float> c(static_cast<size_t>(n * dim)), kpe(static_cast<size_t>(n * dr));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < dim; ++i)
        c[j * dim + i] = stage.bf16 ? Bf16ToF32(stage.LatentBits(j, i)) : stage.c32[j * dim + i];
      for (int64_t i = 0; i < dr; ++i) kpe[j * dr + i] = Bf16ToF32(stage.KpeBits(j, i));
    }
    AbsorbedAttentionHeads(q_lat, q_lat_stride, q_pe, q_pe_stride, n_heads, c.data(), kpe.data(), n, dim, dr, scale,
                           o_lat, o_stride, scratch);
    return;
  }
  // scratch: [n_heads, n] latent scores, then the rope scores behind them; once combined, the
  // probabilities transposed ([n, n_heads]: one key's heads side by side for the output loop's
  // broadcasts) take the rope scores' place.
  float* s = scratch;
  float* s_pe = scratch + n_heads * n;
  if (stage.bf16) Dots<true>(q_lat, q_lat_stride, n_heads, stage.c16.data(), dim, n, s);
  else Dots<false>(q_lat, q_lat_stride, n_heads, stage.c32.data(), dim, n, s);
  Dots<true>(q_pe, q_pe_stride, n_heads, stage.kpe.data(), dr, n, s_pe);
  CombineScores(s, s_pe, n_heads * n, scale);
  for (int64_t h = 0; h < n_heads; ++h) SoftmaxToBf16(s + h * n, n);
  float* pt = s_pe;
  TransposeProbabilities(s, n_heads, n, pt);
  if (stage.bf16) Outputs<true>(pt, n_heads, n, stage.c16.data(), dim, o_lat, o_stride);
  else Outputs<false>(pt, n_heads, n, stage.c32.data(), dim, o_lat, o_stride);
  for (int64_t h = 0; h < n_heads; ++h) RoundToBf16InPlace(o_lat + h * o_stride, dim);
}

}  // namespace pdserve::kernels
