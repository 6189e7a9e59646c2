#include "grammar/bitmask.h"

#include <bit>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pdserve::grammar {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

int64_t CountAllowed(const uint32_t* mask, int64_t vocab) {
  int64_t n = 0;
  const int64_t full = vocab / 32;
  for (int64_t w = 0; w < full; ++w) n += std::popcount(mask[w]);
  for (int64_t i = full * 32; i < vocab; ++i) n += MaskAllows(mask, static_cast<int32_t>(i));
  return n;
}

void ApplyTokenBitmaskScalar(float* logits, int64_t vocab, const uint32_t* mask) {
  for (int64_t i = 0; i < vocab; ++i)
    if (!MaskAllows(mask, static_cast<int32_t>(i))) logits[i] = kNegInf;
}

void ApplyTokenBitmask(float* logits, int64_t vocab, const uint32_t* mask) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (; i + 32 <= vocab; i += 32) {
    const uint32_t word = mask[i >> 5];
    if (word == 0xFFFFFFFFu) continue;
    float* p = logits + i;
    if (word == 0) {
      _mm256_storeu_ps(p, neg_inf);
      _mm256_storeu_ps(p + 8, neg_inf);
      _mm256_storeu_ps(p + 16, neg_inf);
      _mm256_storeu_ps(p + 24, neg_inf);
      continue;
    }
    for (int q = 0; q < 4; ++q) {
      const __m256i bits = _mm256_set1_epi32(static_cast<int>((word >> (8 * q)) & 0xFFu));
      // Lane j keeps its logit when bit j of this byte is set.
      const __m256i keep = _mm256_cmpeq_epi32(_mm256_and_si256(bits, lane_bit), lane_bit);
      const __m256 x = _mm256_loadu_ps(p + 8 * q);
      _mm256_storeu_ps(p + 8 * q, _mm256_blendv_ps(neg_inf, x, _mm256_castsi256_ps(keep)));
    }
  }
#endif
  for (; i < vocab; ++i)
    if (!MaskAllows(mask, static_cast<int32_t>(i))) logits[i] = kNegInf;
}

void ApplyTokenBitmaskRows(float* logits, int64_t logits_stride, int64_t vocab, const uint32_t* masks,
                           int64_t mask_stride_words, std::span<const int32_t> rows) {
  for (size_t k = 0; k < rows.size(); ++k)
    ApplyTokenBitmask(logits + static_cast<int64_t>(rows[k]) * logits_stride, vocab,
                      masks + static_cast<int64_t>(k) * mask_stride_words);
}

}  // namespace pdserve::grammar
