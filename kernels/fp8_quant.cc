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

namespace {

// F32ToFp8E4M3 (common/dtype.h) of 8 values at once, bit for bit: round to nearest even on
// the e4m3 grid, saturate at 448 (0x7e), NaN -> 0x7f. Codes in the low byte of each lane.
//   |x| >= 2^-6 (normal e4m3): round the fp32 mantissa to 3 bits on the bits themselves
//     (a carry moves into the exponent, as it should), then rebias the exponent 127 -> 7;
//   |x| < 2^-6: the quantum is 2^-9, so the code is RNE(|x| * 2^9) (exact scaling; 8 is the
//     smallest normal, code 0x08, which the formula for normals gives too).
inline __m256i F32ToFp8E4M3x8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i abs_bits = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(abs_bits, 20), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(abs_bits, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), lsb)), 20);
  __m256i normal = _mm256_sub_epi32(rounded, _mm256_set1_epi32((127 - 7) << 3));
  normal = _mm256_min_epi32(normal, _mm256_set1_epi32(0x7e));  // 448 and above (inf too)
  const __m256 a = _mm256_castsi256_ps(abs_bits);
  const __m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)));  // RNE (MXCSR default)
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3c800000), abs_bits);  // |x| < 2^-6
  const __m256i code = _mm256_or_si256(_mm256_blendv_epi8(normal, sub, is_sub), sign);
  const __m256i is_nan = _mm256_cmpgt_epi32(abs_bits, _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), is_nan);
}

// The low bytes of 8 int32 lanes -> 8 bytes.
inline void StoreLowBytes(__m256i v, uint8_t* out) {
  const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i packed = _mm256_shuffle_epi8(v, shuf);
  const uint32_t lo = static_cast<uint32_t>(_mm256_extract_epi32(packed, 0));
  const uint32_t hi = static_cast<uint32_t>(_mm256_extract_epi32(packed, 4));
  std::memcpy(out, &lo, 4);
  std::memcpy(out + 4, &hi, 4);
}

}  // namespace

void F32ToFp8E4M3Rows(const float* x, int64_t n, uint8_t* codes) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) StoreLowBytes(F32ToFp8E4M3x8(_mm256_loadu_ps(x + i)), codes + i);
  for (; i < n; ++i) codes[i] = F32ToFp8E4M3(x[i]);
}

void ActQuantFp8(const float* x, int64_t n, uint8_t* codes, float* scales) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 hi = _mm256_set1_ps(kFp8E4M3Max), lo = _mm256_set1_ps(-kFp8E4M3Max);
  for (int64_t b = 0; b < n / kFp8BlockSize; ++b) {
    const float* xb = x + b * kFp8BlockSize;
    // amax: max is exact and order-free; a NaN is skipped, as std::max(amax, NaN) skips it
    // (max_ps returns its second operand when either is NaN).
    __m256 m = _mm256_setzero_ps();
    for (int64_t i = 0; i < kFp8BlockSize; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + i), abs_mask), m);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float amax = 0.0f;
    for (float v : lanes) amax = std::max(amax, v);
    const float s = Fp8BlockScale(amax);
    scales[b] = s;
    const __m256 vs = _mm256_set1_ps(s);
    for (int64_t i = 0; i < kFp8BlockSize; i += 8) {
      // clamp(x / s, +-448) with a NaN kept (operand order), as std::clamp keeps it.
      const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_div_ps(_mm256_loadu_ps(xb + i), vs)));
      StoreLowBytes(F32ToFp8E4M3x8(v), codes + b * kFp8BlockSize + i);
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

void Fp8MagnitudeBf16Bytes(float mul, uint8_t hi[128], uint8_t lo[128]) {
  for (int c = 0; c < 128; ++c) {
    const float v = _cvtsh_ss(static_cast<unsigned short>(c << 7)) * mul;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    hi[c] = static_cast<uint8_t>(bits >> 24);
    lo[c] = static_cast<uint8_t>(bits >> 16);
  }
}

void PairedWordPicks(uint8_t pick[2][64]) {
  for (int g = 0; g < 2; ++g)
    for (int w = 0; w < 16; ++w) {
      pick[g][4 * w + 0] = static_cast<uint8_t>(32 * g + w);
      pick[g][4 * w + 1] = static_cast<uint8_t>(64 + 32 * g + w);
      pick[g][4 * w + 2] = static_cast<uint8_t>(32 * g + 16 + w);
      pick[g][4 * w + 3] = static_cast<uint8_t>(64 + 32 * g + 16 + w);
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
