// The avx2 level's INT8 kernels (kernels/gemm_int8.h): x widened to int16, products by
// vpmaddwd. Two paths chosen by the GEMM's m (integer sums are exact, so both give the same
// bits): the weight-streaming decode path for m <= kGemmInt8SmallMMax, and the packed-panel
// tiled path (gemm_int8_avx2_tiled.cc) above.
//
// Decode path: a block computes M x-rows against R weight rows with M*R int32 accumulators
// (<= 12, so they, one widened weight vector and one x vector fit the 16 ymm registers). Per 16
// k: one 16-byte load + sign extension per weight row, one vpmaddwd + vpaddd per (row, x-row).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/gemm_int8_internal.h"
#include "kernels/isa_kernels.h"

namespace pdserve::kernels::internal {
namespace {

// Weight rows per block for M x-rows (1..4); m > 4 goes in groups of 4 rows.
constexpr int kRowsForM[5] = {0, 8, 4, 4, 3};
constexpr int kGroupM = 4;
// Prefetched next blocks up to this size go to L1 (48 KiB on the Zen 5 VM), larger ones to L2.
constexpr int64_t kPrefetchL1Bytes = 16 << 10;

inline int32_t Hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// acc[i][r] = sum_k x16[i][k] * w[r][k] for i < M, r < R.
// While it runs, the bytes [next, next_end) (the weight rows of the block that follows) are
// prefetched, spread evenly over the k loop: rows of ~1 KB are too short for the hardware
// stream prefetcher to ramp up on (bench/w8a8 GEMV from DRAM: 15 -> see docs/quantization.md).
template <int M, int R>
void DotBlock(const int16_t* x16, int64_t ldx16, const int8_t* w, int64_t ldw, int64_t n_in,
              int32_t acc[kGroupM][8], const int8_t* next, const int8_t* next_end) {
  int64_t k = 0;
#if defined(__AVX2__)
  __m256i a[M][R];
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a[i][r] = _mm256_setzero_si256();
  }
  // Lines of the next block to prefetch per 16-wide k step (rounded up).
  const int64_t steps = std::max<int64_t>(1, n_in / 16);
  const int64_t lines_per_step = ((next_end - next) / 64 + steps - 1) / steps;
  const char* pf = reinterpret_cast<const char*>(next);
  const char* pf_end = reinterpret_cast<const char*>(next_end);
  // Into L1 while the next block fits beside the streaming one; a larger one (long rows: 8 x 7
  // KB on V3.2's hidden size) would evict itself before use, so it goes to L2 (m = 1 GEMV
  // 2048x7168: 27 -> 45 GB/s; 3072x384 keeps 30 GB/s only with L1).
  const bool to_l1 = pf_end - pf <= kPrefetchL1Bytes;
  for (; k + 16 <= n_in; k += 16) {
    for (int64_t l = 0; l < lines_per_step && pf < pf_end; ++l, pf += 64) {
      if (to_l1) {
        _mm_prefetch(pf, _MM_HINT_T0);
      } else {
        _mm_prefetch(pf, _MM_HINT_T1);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * ldw + k)));
#pragma GCC unroll 16
      for (int i = 0; i < M; ++i) {
        const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(x16 + i * ldx16 + k));
        a[i][r] = _mm256_add_epi32(a[i][r], _mm256_madd_epi16(xv, wv));
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < R; ++r) acc[i][r] = Hsum(a[i][r]);
  }
#else
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < R; ++r) acc[i][r] = 0;
  }
#endif
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < R; ++r) {
      int32_t s = acc[i][r];
      for (int64_t kk = k; kk < n_in; ++kk) s += int32_t{x16[i * ldx16 + kk]} * w[r * ldw + kk];
      acc[i][r] = s;
    }
  }
}

using BlockFn = void (*)(const int16_t*, int64_t, const int8_t*, int64_t, int64_t, int32_t[kGroupM][8],
                         const int8_t*, const int8_t*);

template <int M>
BlockFn PickBlock(int r) {
  static constexpr BlockFn kFns[8] = {&DotBlock<M, 1>, &DotBlock<M, 2>, &DotBlock<M, 3>, &DotBlock<M, 4>,
                                      &DotBlock<M, 5>, &DotBlock<M, 6>, &DotBlock<M, 7>, &DotBlock<M, 8>};
  return kFns[r - 1];
}

BlockFn Block(int m, int r) {
  switch (m) {
    case 1: return PickBlock<1>(r);
    case 2: return PickBlock<2>(r);
    case 3: return PickBlock<3>(r);
    default: return PickBlock<4>(r);
  }
}

}  // namespace

void WidenRows(const int8_t* x, int64_t m, int64_t n, int64_t ldx, int16_t* x16, int64_t ldx16) {
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* src = x + i * ldx;
    int16_t* dst = x16 + i * ldx16;
    int64_t k = 0;
#if defined(__AVX2__)
    for (; k + 16 <= n; k += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k),
                          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
#endif
    for (; k < n; ++k) dst[k] = src[k];
    for (; k < ldx16; ++k) dst[k] = 0;
  }
}

void GemmInt8SmallM(const Int8Problem& p, int64_t i_begin, int64_t i_end, int64_t j_begin,
                    int64_t j_end) {
  const Int8WeightView& w = p.w;
  const int16_t* x16 = static_cast<const int16_t*>(p.xp);
  const int64_t ldx16 = WidenedStride(w.n_in);
  int32_t acc[kGroupM][8];
  for (int64_t i = i_begin; i < i_end; i += kGroupM) {
    const int mg = static_cast<int>(std::min<int64_t>(kGroupM, i_end - i));
    const int rows = i_end - i_begin > kGroupM ? kRowsForM[kGroupM] : kRowsForM[mg];
    for (int64_t j = j_begin; j < j_end; j += rows) {
      const int r = static_cast<int>(std::min<int64_t>(rows, j_end - j));
      // The next block's rows (none after the slice's last block).
      const int64_t jn = std::min(j + rows, j_end), rn = std::min<int64_t>(rows, j_end - jn);
      const int8_t* next = w.data + jn * w.ld;
      Block(mg, r)(x16 + i * ldx16, ldx16, w.data + j * w.ld, w.ld, w.n_in, acc, next,
                   rn > 0 ? next + (rn - 1) * w.ld + w.n_in : next);
      for (int ii = 0; ii < mg; ++ii) {
        if (p.raw) {
          int32_t* y = static_cast<int32_t*>(p.y) + (i + ii) * p.ldy + j;
          for (int rr = 0; rr < r; ++rr) y[rr] = acc[ii][rr];
        } else {
          float* y = static_cast<float*>(p.y) + (i + ii) * p.ldy + j;
          const float xs = p.x_scales[i + ii];
          for (int rr = 0; rr < r; ++rr) y[rr] = (static_cast<float>(acc[ii][rr]) * xs) * w.scales[j + rr];
        }
      }
    }
  }
}

namespace avx2 {

int64_t Int8PreparedBytes(int64_t m, int64_t n_in) { return m * WidenedStride(n_in) * 2; }

void Int8Prepare(const int8_t* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1, int64_t n_in,
                 void* xp, uint8_t* terms) {
  const int64_t ld = WidenedStride(n_in);
  WidenRows(x + i0 * ldx, i1 - i0, n_in, ldx, static_cast<int16_t*>(xp) + i0 * ld, ld);
}

void Int8Compute(const Int8Problem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (p.m > kGemmInt8SmallMMax) {
    GemmInt8Tiled(p, i0, i1, j0, j1);
  } else {
    GemmInt8SmallM(p, i0, i1, j0, j1);
  }
}

}  // namespace avx2
}  // namespace pdserve::kernels::internal
