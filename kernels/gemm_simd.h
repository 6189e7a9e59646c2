// Small element helpers shared by the GEMM paths: loading 8 weights as fp32 from F32 or BF16
// storage, and the one horizontal-sum tree every decode output uses.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "common/check.h"
#include "common/dtype.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pdserve::kernels::internal {

// Prefetch hints by address (an integer: the targets may lie outside any object, which a
// prefetch tolerates). No-ops in the scalar build.
inline void PrefetchL1(uintptr_t a) {
#if defined(__AVX2__)
  _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
#endif
}
inline void PrefetchL2(uintptr_t a) {
#if defined(__AVX2__)
  _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T1);
#endif
}

#if defined(__AVX2__)
// In-register 8x8 transpose of dwords viewed as floats: r[t][c] -> r[c][t].
inline void Transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, rows 4-7
    const __m256* th = t + 4 * h;
    u[4 * h + 0] = _mm256_shuffle_ps(th[0], th[2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(th[0], th[2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(th[1], th[3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(th[1], th[3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(u[c], u[c + 4], 0x31);
  }
}
// The same on integer lanes (the int8 tiled path's pairs of int16).
inline void Transpose8x8(__m256i ri[8]) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_castsi256_ps(ri[i]);
  Transpose8x8(r);
  for (int i = 0; i < 8; ++i) ri[i] = _mm256_castps_si256(r[i]);
}
#endif

inline float WeightToF32(const float* p) { return *p; }
inline float WeightToF32(const uint16_t* p) { return Bf16ToF32(*p); }

// Grow-only, 64-byte aligned float buffer; meant to be thread_local and reused across calls.
class AlignedScratch {
 public:
  float* Get(int64_t n_floats) {
    if (n_floats > capacity_) {
      const size_t bytes = (static_cast<size_t>(n_floats) * sizeof(float) + 63) & ~size_t{63};
      data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      PDSERVE_CHECK(data_ != nullptr, "Gemm: scratch allocation");
      capacity_ = n_floats;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  int64_t capacity_ = 0;
};

// Pairwise sum of 8 lanes in the fixed order ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), the order
// of the AVX2 reduction below, so the scalar build gives the same bits.
inline float HsumLanes(const float* l) {
  const float s0 = l[0] + l[4], s1 = l[1] + l[5], s2 = l[2] + l[6], s3 = l[3] + l[7];
  return (s0 + s2) + (s1 + s3);
}

#if defined(__AVX2__)
inline __m256 LoadW8(const float* p) { return _mm256_loadu_ps(p); }
// bf16 -> fp32 is exact: zero-extend to 32 bits and shift into the high half.
inline __m256 LoadW8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float Hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));       // s0+s2, s1+s3
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));  // (s0+s2)+(s1+s3)
}
#endif

}  // namespace pdserve::kernels::internal
