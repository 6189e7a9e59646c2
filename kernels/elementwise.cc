#include "kernels/elementwise.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/dtype.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels {

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

void LayerNorm(const float* x, const float* w, const float* b, int64_t n, float eps, float* out) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(n);
  double var = 0.0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / std::sqrt(static_cast<float>(var / static_cast<double>(n)) + eps);
  const float m = static_cast<float>(mean);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - m) * inv * w[i] + b[i];
}

void RoundToBf16InPlace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), mask);
    // NaN lanes keep their (quieted) value through the scalar path semantics.
    __m256 isnan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m256 res = _mm256_blendv_ps(_mm256_castsi256_ps(r), v, isnan);
    _mm256_storeu_ps(x + i, res);
  }
#endif
  for (; i < n; ++i) x[i] = RoundToBf16(x[i]);
}

void SiluMulBf16(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float s = g / (1.0f + std::exp(-g));
    out[i] = RoundToBf16(s * up[i]);
  }
}

namespace {

// exp(x) for the softmax (x <= 0 after the max is subtracted): Cephes' expf scheme in fp32 FMA
// steps: n = round(x log2 e), r = x - n ln 2 (two-part ln 2), a degree-6 polynomial, times 2^n.
// Within 2 ulp of exp over [-87, 0], where every result is a normal float; below -87 (exp <
// 1.7e-38, nothing a softmax over a finite maximum keeps) it returns 0, as it does for -inf. Every lane runs the same steps as the scalar tail, so the result of an element does
// not depend on where it sits in the vector.
constexpr float kExpLo = -87.0f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

inline float SoftmaxExp(float x) {
  if (!(x >= kExpLo)) return 0.0f;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kP0;
  p = std::fma(p, r, kP1);
  p = std::fma(p, r, kP2);
  p = std::fma(p, r, kP3);
  p = std::fma(p, r, kP4);
  p = std::fma(p, r, kP5);
  const float y = std::fma(p, r * r, r) + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &y, 4);
  bits += static_cast<int32_t>(n) << 23;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

#if defined(__AVX2__)
inline __m256 SoftmaxExp8(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_GE_OQ);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // n is finite here for live lanes (dead lanes are masked out below).
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(_mm256_and_ps(n, live)), 23);
  return _mm256_and_ps(_mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e)), live);
}
#endif

// Softmax's scalar tail and its sum: x[i] = SoftmaxExp(x[i] - mx) for i from `i` on, each added
// to the lane its index would use, then the lanes summed in the fixed tree
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Shared by every Softmax variant, so all sum alike.
inline float FinishSoftmaxSum(float* x, int64_t i, int64_t n, float mx, float* lanes) {
  for (; i < n; ++i) {
    x[i] = SoftmaxExp(x[i] - mx);
    lanes[i % 8] += x[i];
  }
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

}  // namespace

// Max (order-free), then e_i = SoftmaxExp(x_i - max) and their sum in 8 lanes (lane l takes
// i = l mod 8 in order; the scalar tail adds to the lane its index would use), lanes summed as
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then e_i * (1 / sum).
void Softmax(float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX2__)
  // The max in 8 lanes (the scalar chain waits 4 cycles per element). Max is exact; a NaN is
  // skipped as the scalar std::max(mx, x) skips it (max_ps returns its second operand when
  // either is NaN); only the sign of a zero maximum can differ, and x - (+0) == x - (-0) for
  // every x but a zero, whose exponential is 1 either way.
  __m256 vmax = _mm256_set1_ps(mx);
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(_mm256_loadu_ps(x + i), vmax);
  alignas(32) float max_lanes[8];
  _mm256_store_ps(max_lanes, vmax);
  for (float v : max_lanes) mx = std::max(mx, v);
#endif
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  i = 0;
#if defined(__AVX2__)
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = SoftmaxExp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  _mm256_storeu_ps(lanes, acc);
#endif
  const float inv = 1.0f / FinishSoftmaxSum(x, i, n, mx, lanes);
  for (i = 0; i < n; ++i) x[i] *= inv;
}

#if defined(__AVX2__)
namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq")
// GCC 12 flags the deliberately undefined upper lanes inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// SoftmaxExp8's operations on 16 lanes (each lane's value is SoftmaxExp8's for it).
inline __m512 SoftmaxExp16(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpLo), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(_mm512_maskz_mov_ps(live, n)), 23);
  return _mm512_maskz_mov_ps(live, _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e)));
}

// SoftmaxToBf16 on AVX-512: Softmax's max, its 8-lane sum (a 16-value step adds its low then
// its high half, as two of Softmax's 8-value steps would), then x * inv rounded to bf16 (finite
// values: round to nearest even on the bits, as RoundToBf16InPlace).
void SoftmaxToBf16Avx512(float* x, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(_mm512_loadu_ps(x + i), vmax);
  float mx = _mm512_reduce_max_ps(vmax);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const __m512 vm = _mm512_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = SoftmaxExp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
    _mm512_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
    acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(e, 1));
  }
  if (i + 8 <= n) {
    const __m256 e = SoftmaxExp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm512_castps512_ps256(vm)));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
    i += 8;
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  const float inv = 1.0f / FinishSoftmaxSum(x, i, n, mx, lanes);
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    _mm512_storeu_si512(x + i, _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), high));
  }
  for (; i < n; ++i) x[i] = RoundToBf16(x[i] * inv);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace
#endif

void SoftmaxToBf16(float* x, int64_t n) {
#if defined(__AVX2__)
  if (internal::ActiveIsaHasAvx512()) {
    SoftmaxToBf16Avx512(x, n);
    return;
  }
#endif
  Softmax(x, n);
  RoundToBf16InPlace(x, n);
}

namespace {
// The transform's scalar butterflies: each stage h pairs x[j] with x[j + h] (j's bit h clear)
// into (a + b, a - b).
void HadamardScalar(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h <<= 1) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}
}  // namespace

// The same butterflies on 8 lanes: stages 1, 2 and 4 pair lanes inside a register (the partner
// swapped in by a permute; a lane whose bit h is set takes partner - self = a - b), the larger
// stages whole registers. Each element is the same a + b or a - b as the scalar loop's, so the
// result is bit for bit the same. One row of the indexer's 16 heads x 128: 6.5 -> ~1 us.
void HadamardTransform(float* x, int64_t n) {
#if defined(__AVX2__)
  if (n >= 8) {
    const __m256 high1 = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1));
    const __m256 high2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, -1, -1, 0, 0, -1, -1));
    const __m256 high4 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1));
    for (int64_t i = 0; i < n; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      __m256 p = _mm256_permute_ps(v, 0xB1);  // lanes 1 0 3 2 ...
      v = _mm256_blendv_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), high1);
      p = _mm256_permute_ps(v, 0x4E);  // lanes 2 3 0 1 ...
      v = _mm256_blendv_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), high2);
      p = _mm256_permute2f128_ps(v, v, 0x01);  // the 128-bit halves swapped
      v = _mm256_blendv_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), high4);
      _mm256_storeu_ps(x + i, v);
    }
    for (int64_t h = 8; h < n; h <<= 1)
      for (int64_t i = 0; i < n; i += 2 * h)
        for (int64_t j = i; j < i + h; j += 8) {
          const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
          _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
          _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
        }
    return;
  }
#endif
  HadamardScalar(x, n);
}

namespace internal {
void TEST_HadamardScalar(float* x, int64_t n) { HadamardScalar(x, n); }
}  // namespace internal

int64_t TopKIndices(const float* scores, int64_t n, int64_t k, int32_t* out, int32_t* scratch) {
  const int64_t m = std::min(k, n);
  if (m <= 0) return 0;
  for (int64_t i = 0; i < n; ++i) scratch[i] = static_cast<int32_t>(i);
  auto better = [scores](int32_t a, int32_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  };
  if (m < n) std::nth_element(scratch, scratch + m - 1, scratch + n, better);
  std::copy(scratch, scratch + m, out);
  std::sort(out, out + m);
  return m;
}

float DotF32(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  sum = _mm_cvtss_f32(s);
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void Axpy(float a, const float* x, int64_t n, float* y) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace pdserve::kernels

namespace pdserve::kernels {
void AxpyRow(float a, const void* row, bool row_is_bf16, int64_t n, float* y) {
  if (!row_is_bf16) {
    Axpy(a, static_cast<const float*>(row), n, y);
    return;
  }
  const uint16_t* r = static_cast<const uint16_t*>(row);
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) {
    __m256i w16 = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + i)));
    __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(w16, 16));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, w, _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += a * Bf16ToF32(r[i]);
}
}  // namespace pdserve::kernels
