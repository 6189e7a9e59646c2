#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pdserve::kernels {

namespace {

// One code from one value; the AVX2 body computes the same min/max/round-half-even.
inline int8_t QuantizeOne(float x, float inv) {
  const float v = std::min(std::max(x * inv, -127.0f), 127.0f);
  return static_cast<int8_t>(std::nearbyint(v));  // default rounding mode: half to even
}

}  // namespace

float AbsMax(const float* x, int64_t n) {
  int64_t k = 0;
  float amax = 0.0f;
#if defined(__AVX2__)
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  for (; k + 16 <= n; k += 16) {
    m0 = _mm256_max_ps(m0, _mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask));
    m1 = _mm256_max_ps(m1, _mm256_and_ps(_mm256_loadu_ps(x + k + 8), abs_mask));
  }
  m0 = _mm256_max_ps(m0, m1);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  amax = _mm_cvtss_f32(h);
#endif
  for (; k < n; ++k) amax = std::max(amax, std::fabs(x[k]));
  return amax;
}

void QuantizeRowsInt8(const float* x, int64_t m, int64_t n, int64_t ldx, int8_t* q, int64_t ldq,
                      float* scales) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * ldx;
    int8_t* qr = q + i * ldq;
    const float amax = AbsMax(xr, n);
    // amax == 0: every code is 0 whatever inv is; inv = 0 avoids 0 * inf.
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    scales[i] = amax / 127.0f;
    int64_t k = 0;
#if defined(__AVX2__)
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    // packs_epi32 / packs_epi16 interleave 128-bit lanes; this puts the dwords back in order.
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    auto codes = [&](const float* p) {
      const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(p), vinv), lo), hi);
      return _mm256_cvtps_epi32(v);  // MXCSR default: round half to even
    };
    for (; k + 32 <= n; k += 32) {
      const __m256i a = codes(xr + k), b = codes(xr + k + 8);
      const __m256i c = codes(xr + k + 16), d = codes(xr + k + 24);
      const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
      const __m256i abcd = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qr + k), abcd);
    }
#endif
    for (; k < n; ++k) qr[k] = QuantizeOne(xr[k], inv);
  }
}

void DequantizeRowsInt8(const int8_t* q, const float* scales, int64_t m, int64_t n, int64_t ldq,
                        float* x, int64_t ldx) {
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* qr = q + i * ldq;
    float* xr = x + i * ldx;
    const float s = scales[i];
    int64_t k = 0;
#if defined(__AVX2__)
    const __m256 vs = _mm256_set1_ps(s);
    for (; k + 8 <= n; k += 8) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qr + k));
      _mm256_storeu_ps(xr + k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), vs));
    }
#endif
    for (; k < n; ++k) xr[k] = static_cast<float>(qr[k]) * s;
  }
}

}  // namespace pdserve::kernels
