#include "kernels/fp8_quant.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/dtype.h"

namespace pdserve::kernels {

float Fp8BlockScale(float amax) {
  amax = std::max(amax, 1e-4f);
  const float s = amax * (1.0f / kFp8E4M3Max);
  uint32_t bits;
  std::memcpy(&bits, &s, 4);
  // Round up to a power of two: keep the exponent, bump it when any mantissa bit is set.
  uint32_t exp_bits = bits & 0x7f800000u;
  if (bits & 0x007fffffu) exp_bits += 0x00800000u;
  float out;
  std::memcpy(&out, &exp_bits, 4);
  return out;
}

void ActQuantFp8(const float* x, int64_t n, uint8_t* codes, float* scales) {
  for (int64_t b = 0; b < n / kFp8BlockSize; ++b) {
    const float* xb = x + b * kFp8BlockSize;
    float amax = 0.0f;
    for (int64_t i = 0; i < kFp8BlockSize; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float s = Fp8BlockScale(amax);
    scales[b] = s;
    for (int64_t i = 0; i < kFp8BlockSize; ++i) {
      const float v = std::clamp(xb[i] / s, -kFp8E4M3Max, kFp8E4M3Max);
      codes[b * kFp8BlockSize + i] = F32ToFp8E4M3(v);
    }
  }
}

void Fp8RoundTripInPlace(float* x, int64_t n) {
  uint8_t codes[kFp8BlockSize];
  for (int64_t b = 0; b < n / kFp8BlockSize; ++b) {
    float s;
    ActQuantFp8(x + b * kFp8BlockSize, kFp8BlockSize, codes, &s);
    for (int64_t i = 0; i < kFp8BlockSize; ++i) x[b * kFp8BlockSize + i] = Fp8E4M3ToF32(codes[i]) * s;
  }
}

float Fp8DotExact(const uint8_t* a, const uint8_t* b, int64_t n) {
  const float* t = Fp8E4M3DecodeTable();
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(t[a[i]]) * static_cast<double>(t[b[i]]);
  return static_cast<float>(sum);
}

float Fp8DotExactDecodedA(const double* a, const uint8_t* b, int64_t n) {
  const float* t = Fp8E4M3DecodeTable();
  int64_t i = 0;
  double sum = 0.0;
#if defined(__AVX2__)
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    // Gather 8 decoded keys (fp32), widen to double; products and sums stay exact.
    __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + i)));
    __m256 kv = _mm256_i32gather_ps(t, idx, 4);
    acc0 = _mm256_fmadd_pd(_mm256_loadu_pd(a + i), _mm256_cvtps_pd(_mm256_castps256_ps128(kv)), acc0);
    acc1 = _mm256_fmadd_pd(_mm256_loadu_pd(a + i + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(kv, 1)), acc1);
  }
  acc0 = _mm256_add_pd(acc0, acc1);
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, acc0);
  sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < n; ++i) sum += a[i] * static_cast<double>(t[b[i]]);
  return static_cast<float>(sum);
}

}  // namespace pdserve::kernels
