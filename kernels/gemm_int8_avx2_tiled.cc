// The avx2 level's prefill path of GemmInt8: m is large, so the multiply units set the pace.
//
// A task covers (up to kMcMax rows of x) x (up to kNcMax weight rows). It walks k in blocks of
// kKc; per block it widens its weight rows to int16 into a thread-local panel buffer laid out
// [panel of 16 rows][k-pair][16][2] (zero past the last row and past n_in), then for every 6
// rows of x runs the 6x16 microkernel over each panel: 12 ymm int32 accumulators; per k-pair
// two panel loads, six 32-bit broadcasts of (x[k], x[k+1]) straight from the widened x rows,
// twelve vpmaddwd (8 lanes x 2 products each, exact in int32) and twelve vpaddd.
// Between k blocks the partial int32 sums are parked in y itself (int32 bits in the fp32
// slots, or the int32 output); the last block converts them in the epilogue:
// y = (float(acc) * x_scale[i]) * w_scale[j].
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/check.h"
#include "kernels/gemm_int8_internal.h"
#include "kernels/gemm_simd.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pdserve::kernels::internal {
namespace {

constexpr int kMr = 6;   // rows of x per microkernel
constexpr int kNr = 16;  // weight rows (outputs) per microkernel: two ymm of int32
// Blocking, chosen with bench/w8a8 on the 2-core Zen 5 VM (48 KiB L1d, 1 MiB L2 per core): a
// panel buffer of kKc x kNcMax int16 = 256 KiB stays in L2, the 6 x kKc int16 block of x in L1.
constexpr int64_t kKc = 512;  // even
constexpr int64_t kNcMax = 256;

class PanelScratch {
 public:
  int16_t* Get(int64_t n) {
    if (n > capacity_) {
      const size_t bytes = (static_cast<size_t>(n) * sizeof(int16_t) + 63) & ~size_t{63};
      data_.reset(static_cast<int16_t*>(std::aligned_alloc(64, bytes)));
      PDSERVE_CHECK(data_ != nullptr, "GemmInt8: panel scratch allocation");
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(int16_t* p) const { std::free(p); }
  };
  std::unique_ptr<int16_t, Free> data_;
  int64_t capacity_ = 0;
};

// Packs weight rows [j0, j1) x k in [k0, k0 + kc) (kc even) into panels of kNr rows:
// dst[pn * kc * kNr + (kp * kNr + r) * 2 + e] = W[j0 + pn * kNr + r, k0 + 2 * kp + e], zero for
// rows >= j1 or k >= n_in.
void PackPanels(const Int8WeightView& w, int64_t j0, int64_t j1, int64_t k0, int64_t kc,
                int16_t* dst) {
  const int64_t k_valid = std::min(kc, w.n_in - k0);
  for (int64_t jp = j0; jp < j1; jp += kNr, dst += kc * kNr) {
    for (int h = 0; h < kNr / 8; ++h) {
      const int64_t jh = jp + 8 * h;
      const int valid = static_cast<int>(std::clamp<int64_t>(j1 - jh, 0, 8));
      int16_t* d = dst + 8 * h * 2;
      int64_t k = 0;
#if defined(__AVX2__)
      for (; k + 16 <= k_valid; k += 16) {
        __m256i r[8];  // row t: 8 k-pairs of int16 = 8 dwords
        for (int t = 0; t < 8; ++t) {
          r[t] = t < valid ? _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                 reinterpret_cast<const __m128i*>(w.data + (jh + t) * w.ld + k0 + k)))
                           : _mm256_setzero_si256();
        }
        Transpose8x8(r);  // r[pair] = that pair of rows 0..7
        for (int pr = 0; pr < 8; ++pr)
          _mm256_store_si256(reinterpret_cast<__m256i*>(d + ((k / 2 + pr) * kNr) * 2), r[pr]);
      }
#endif
      for (; k < kc; ++k) {
        for (int t = 0; t < 8; ++t) {
          d[((k / 2) * kNr + t) * 2 + (k & 1)] =
              (t < valid && k < k_valid) ? static_cast<int16_t>(w.data[(jh + t) * w.ld + k0 + k]) : 0;
        }
      }
    }
  }
}

// Accumulates (or starts) the int32 sums of an MR x nr tile over kp k-pairs; on the last k
// block writes the epilogue (fp32 dequantized, or raw int32), else parks int32 sums in y.
template <int MR>
void MicroKernel(int64_t kp, const int16_t* const* xr, const int16_t* panel, void* yv,
                 int64_t ldy, int nr, bool accumulate, bool last, bool raw, const float* xs,
                 const float* ws) {
  int32_t* yi = static_cast<int32_t*>(yv);  // int32 view of the same slots
#if defined(__AVX2__)
  alignas(32) static constexpr int32_t kMaskSrc[24] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0,
                                                       0,  0,  0,  0,  0,  0,  0,  0,  0, 0, 0, 0};
  const __m256i mask0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskSrc + 8 - std::min(nr, 8)));
  const __m256i mask1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskSrc + 8 - std::max(nr - 8, 0)));
  __m256i c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (!accumulate) {
      c0[r] = _mm256_setzero_si256();
      c1[r] = _mm256_setzero_si256();
    } else if (nr == kNr) {
      c0[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yi + r * ldy));
      c1[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yi + r * ldy + 8));
    } else {
      c0[r] = _mm256_maskload_epi32(yi + r * ldy, mask0);
      c1[r] = _mm256_maskload_epi32(yi + r * ldy + 8, mask1);
    }
  }
  const int16_t* x[MR];
  for (int r = 0; r < MR; ++r) x[r] = xr[r];
  for (int64_t p = 0; p < kp; ++p) {
    const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + p * 2 * kNr));
    const __m256i b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + p * 2 * kNr + 16));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, x[r] + 2 * p, 4);
      const __m256i a = _mm256_set1_epi32(pair);
      c0[r] = _mm256_add_epi32(c0[r], _mm256_madd_epi16(a, b0));
      c1[r] = _mm256_add_epi32(c1[r], _mm256_madd_epi16(a, b1));
    }
  }
  float* yf = static_cast<float*>(yv);
  if (last && !raw) {
    const __m256 w0 = _mm256_castsi256_ps(_mm256_maskload_epi32(reinterpret_cast<const int32_t*>(ws), mask0));
    const __m256 w1 = _mm256_castsi256_ps(_mm256_maskload_epi32(reinterpret_cast<const int32_t*>(ws + 8), mask1));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 s = _mm256_set1_ps(xs[r]);
      const __m256 f0 = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c0[r]), s), w0);
      const __m256 f1 = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(c1[r]), s), w1);
      if (nr == kNr) {
        _mm256_storeu_ps(yf + r * ldy, f0);
        _mm256_storeu_ps(yf + r * ldy + 8, f1);
      } else {
        _mm256_maskstore_ps(yf + r * ldy, mask0, f0);
        _mm256_maskstore_ps(yf + r * ldy + 8, mask1, f1);
      }
    }
    return;
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (nr == kNr) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(yi + r * ldy), c0[r]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(yi + r * ldy + 8), c1[r]);
    } else {
      _mm256_maskstore_epi32(yi + r * ldy, mask0, c0[r]);
      _mm256_maskstore_epi32(yi + r * ldy + 8, mask1, c1[r]);
    }
  }
#else
  float* yf = static_cast<float*>(yv);
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < nr; ++c) {
      int32_t s = 0;
      if (accumulate) std::memcpy(&s, yi + r * ldy + c, 4);
      for (int64_t p = 0; p < kp; ++p)
        s += int32_t{xr[r][2 * p]} * panel[(p * kNr + c) * 2] + int32_t{xr[r][2 * p + 1]} * panel[(p * kNr + c) * 2 + 1];
      if (last && !raw) {
        yf[r * ldy + c] = (static_cast<float>(s) * xs[r]) * ws[c];
      } else {
        std::memcpy(yi + r * ldy + c, &s, 4);
      }
    }
  }
#endif
}

using MicroKernelFn = void (*)(int64_t, const int16_t* const*, const int16_t*, void*, int64_t, int,
                               bool, bool, bool, const float*, const float*);
constexpr MicroKernelFn kMicroKernels[kMr] = {&MicroKernel<1>, &MicroKernel<2>, &MicroKernel<3>,
                                              &MicroKernel<4>, &MicroKernel<5>, &MicroKernel<6>};

// Outputs [j0, j1) (at most kNcMax) of rows [i0, i1).
void TiledBlock(const Int8Problem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  thread_local PanelScratch scratch;
  const int64_t n_panels = (j1 - j0 + kNr - 1) / kNr;
  int16_t* panels = scratch.Get(kKc * n_panels * kNr);
  const int64_t n_in = p.w.n_in;
  const int16_t* x16 = static_cast<const int16_t*>(p.xp);
  const int64_t ldx16 = WidenedStride(n_in);
  const size_t elem = 4;  // fp32 and int32 outputs have the same size
  uint8_t* y = static_cast<uint8_t*>(p.y);
  for (int64_t k0 = 0; k0 < n_in; k0 += kKc) {
    const int64_t kc = std::min(kKc, (n_in - k0 + 1) / 2 * 2);  // even; padding is zero
    const bool last = k0 + kKc >= n_in;
    PackPanels(p.w, j0, j1, k0, kc, panels);
    for (int64_t i = i0; i < i1; i += kMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kMr, i1 - i));
      const int16_t* xr[kMr];
      for (int r = 0; r < mr; ++r) xr[r] = x16 + (i + r) * ldx16 + k0;
      const float* xs = p.raw ? nullptr : p.x_scales + i;
      for (int64_t pn = 0; pn < n_panels; ++pn) {
        const int64_t j = j0 + pn * kNr;
        const int nr = static_cast<int>(std::min<int64_t>(kNr, j1 - j));
        kMicroKernels[mr - 1](kc / 2, xr, panels + pn * kc * kNr, y + (i * p.ldy + j) * elem, p.ldy, nr,
                              k0 > 0, last, p.raw, xs, p.raw ? nullptr : p.w.scales + j);
      }
    }
  }
}

}  // namespace

void GemmInt8Tiled(const Int8Problem& p, int64_t i0, int64_t i1, int64_t j_begin, int64_t j_end) {
  // Output blocks of at most kNcMax, so the panels stay in L2.
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kNcMax) {
    TiledBlock(p, i0, i1, j0, std::min(j_end, j0 + kNcMax));
  }
}

}  // namespace pdserve::kernels::internal
