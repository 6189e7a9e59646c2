// The avx2 level's tiled path (kernels/gemm_avx2.cc uses it for tasks of >= 12 rows of x): the
// FMA units, not memory, set the pace. Each output is one sequential fp32 FMA chain over
// k = 0 .. n_in-1 (partial sums written after a k block are reloaded exactly): the same bits
// as the weight-streaming kernel of gemm_avx2.cc.
//
// A task takes its weight rows kNcMax at a time and walks k in blocks of kKc; per block it
// converts and transposes those rows into a thread-local panel buffer laid out
// [panel of 16 rows][k][16] (fp32, zero-padded past the last row), then for every 6 rows of x
// runs the 6x16 microkernel over each panel: 12 ymm accumulators, per k two panel loads and six
// broadcasts of x straight from x's rows (x is not packed: its 6 x kKc block sits in L1 while the
// panels stream from L2). The last rows use a microkernel with fewer rows.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "common/check.h"
#include "kernels/gemm.h"
#include "kernels/gemm_simd.h"

namespace pdserve::kernels::internal::avx2 {
namespace {

constexpr int kMr = 6;    // rows of x per microkernel
constexpr int kNr = 16;   // weight rows (outputs) per microkernel: two ymm
// Blocking, chosen with bench/gemm on the 2-core AMD EPYC (Zen 5, 48 KiB L1d, 1 MiB L2) VM: a
// panel buffer of kKc x kNcMax fp32 = 256 KiB stays in L2. kKc = 512 / kNcMax = 128 beat 256 / 256
// and 8 other pairs at m = 16-48 by 3-10% (fewer partial-sum passes) and tied at m = 512.
constexpr int64_t kKc = 512;
constexpr int64_t kNcMax = 128;

// Weights usually come from DRAM (a layer's matrix is read once per forward pass), and packing
// touches 8 rows x kKc at a time, too many short streams for the hardware prefetchers: it
// prefetches the 8-row group it will pack two groups later. Without it the tiled path ran at
// 0.3x its hot-cache speed on cold weights (bench/gemm, Zen 5 VM).
constexpr int64_t kPackAheadRows = 16;
template <typename T>
constexpr int64_t kLine = 64 / sizeof(T);  // elements per cache line

// Packs weight rows [j0, j1) x columns [k0, k0 + kc) into panels of kNr rows:
// dst[p * kc * kNr + k * kNr + r] = W[j0 + p * kNr + r, k0 + k], zero for rows >= j1.
template <typename T>
void PackPanels(const T* w, int64_t ldw, int64_t j0, int64_t j1, int64_t k0, int64_t kc,
                float* dst) {
  for (int64_t jp = j0; jp < j1; jp += kNr, dst += kc * kNr) {
    for (int h = 0; h < kNr / 8; ++h) {
      const int64_t jh = jp + 8 * h;
      const int valid = static_cast<int>(std::clamp<int64_t>(j1 - jh, 0, 8));
      float* d = dst + 8 * h;
      int64_t k = 0;
#if defined(__AVX2__)
      // The rows kPackAheadRows further on, one prefetch per cache line (as integers: they may
      // lie past the matrix, and prefetches never fault).
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(w + k0) +
                              (jh + kPackAheadRows) * ldw * sizeof(T);
      for (; k + 8 <= kc; k += 8) {
        if ((k & (kLine<T> - 1)) == 0) {
          for (int t = 0; t < 8; ++t) {
            PrefetchL2(ahead + (t * ldw + k) * sizeof(T));
          }
        }
        __m256 r[8];
        if (valid == 8) {
#pragma GCC unroll 8
          for (int t = 0; t < 8; ++t) r[t] = LoadW8(w + (jh + t) * ldw + k0 + k);
        } else {
          for (int t = 0; t < 8; ++t) {
            r[t] = t < valid ? LoadW8(w + (jh + t) * ldw + k0 + k) : _mm256_setzero_ps();
          }
        }
        Transpose8x8(r);
        for (int t = 0; t < 8; ++t) _mm256_store_ps(d + (k + t) * kNr, r[t]);
      }
#endif
      for (; k < kc; ++k) {
        for (int t = 0; t < 8; ++t) {
          d[k * kNr + t] = t < valid ? WeightToF32(w + (jh + t) * ldw + k0 + k) : 0.0f;
        }
      }
    }
  }
}

// y[r * ldy + c] (+)= sum_{k < kc} xr[r][k] * panel[k * kNr + c] for r < MR, c < nr.
// accumulate: start from the values in y (the previous k block) instead of 0.
// MR < kMr serves the last rows of x without computing throw-away rows.
template <int MR>
void MicroKernel(int64_t kc, const float* const* xr, const float* panel, float* y, int64_t ldy,
                 int nr, bool accumulate) {
#if defined(__AVX2__)
  alignas(32) static constexpr int32_t kMaskSrc[24] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0,
                                                       0,  0,  0,  0,  0,  0,  0,  0,  0, 0, 0, 0};
  // Lane masks for columns 0-7 and 8-15 when nr < 16.
  const __m256i mask0 = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(kMaskSrc + 8 - std::min(nr, 8)));
  const __m256i mask1 = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(kMaskSrc + 8 - std::max(nr - 8, 0)));
  __m256 c0[MR], c1[MR];
  const float* x[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    x[r] = xr[r];
    if (!accumulate) {
      c0[r] = _mm256_setzero_ps();
      c1[r] = _mm256_setzero_ps();
    } else if (nr == kNr) {
      c0[r] = _mm256_loadu_ps(y + r * ldy);
      c1[r] = _mm256_loadu_ps(y + r * ldy + 8);
    } else {
      c0[r] = _mm256_maskload_ps(y + r * ldy, mask0);
      c1[r] = _mm256_maskload_ps(y + r * ldy + 8, mask1);
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(panel + k * kNr);
    const __m256 b1 = _mm256_load_ps(panel + k * kNr + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x[r] + k);
      c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (nr == kNr) {
      _mm256_storeu_ps(y + r * ldy, c0[r]);
      _mm256_storeu_ps(y + r * ldy + 8, c1[r]);
    } else {
      _mm256_maskstore_ps(y + r * ldy, mask0, c0[r]);
      _mm256_maskstore_ps(y + r * ldy + 8, mask1, c1[r]);
    }
  }
#else
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < nr; ++c) {
      float s = accumulate ? y[r * ldy + c] : 0.0f;
      for (int64_t k = 0; k < kc; ++k) s = std::fma(xr[r][k], panel[k * kNr + c], s);
      y[r * ldy + c] = s;
    }
  }
#endif
}

using MicroKernelFn = void (*)(int64_t, const float* const*, const float*, float*, int64_t, int,
                               bool);
// kMicroKernels[mr - 1] handles mr rows.
constexpr MicroKernelFn kMicroKernels[kMr] = {&MicroKernel<1>, &MicroKernel<2>, &MicroKernel<3>,
                                              &MicroKernel<4>, &MicroKernel<5>, &MicroKernel<6>};

struct Job {
  const float* x;
  int64_t m, ldx;
  const void* w;
  int64_t ldw, n_in;
  int64_t j_begin, j_end;
  float* y;
  int64_t ldy;
  int64_t mb, nb;  // task grid: row parts x weight-row parts
  void (*pack)(const void* w, int64_t ldw, int64_t j0, int64_t j1, int64_t k0, int64_t kc,
               float* dst);
};

template <typename T>
void PackAny(const void* w, int64_t ldw, int64_t j0, int64_t j1, int64_t k0, int64_t kc,
             float* dst) {
  PackPanels(static_cast<const T*>(w), ldw, j0, j1, k0, kc, dst);
}

// kPanels16 weights (w: the packed dwords, ldw: k pairs per panel): rows [j0, j1) (j0 a
// multiple of 16, so packed and fp32 panels coincide) x columns [k0, k0 + kc) (k0 even) are
// unpacked, not transposed: the pair's low half is k, its high half k + 1. Rows past j1 in the
// last panel get their real values: the microkernel never stores those columns.
void PackFromPanels(const void* w, int64_t ldw, int64_t j0, int64_t j1, int64_t k0, int64_t kc,
                    float* dst) {
  const uint32_t* src = static_cast<const uint32_t*>(w);
  for (int64_t jp = j0; jp < j1; jp += kNr, dst += kc * kNr) {
    const uint32_t* panel = src + (jp / kNr * ldw + k0 / 2) * kNr;
    for (int64_t q = 0; 2 * q < kc; ++q) {
#if defined(__AVX2__)
      const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + q * kNr + 8 * h));
        _mm256_store_ps(dst + 2 * q * kNr + 8 * h, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        if (2 * q + 1 < kc) {
          _mm256_store_ps(dst + (2 * q + 1) * kNr + 8 * h, _mm256_castsi256_ps(_mm256_and_si256(v, hi)));
        }
      }
#else
      for (int t = 0; t < kNr; ++t) {
        const uint32_t v = panel[q * kNr + t];
        dst[2 * q * kNr + t] = WeightToF32(reinterpret_cast<const uint16_t*>(&v));
        if (2 * q + 1 < kc) dst[(2 * q + 1) * kNr + t] = WeightToF32(reinterpret_cast<const uint16_t*>(&v) + 1);
      }
#endif
    }
  }
}

// Boundary `part` of [0, total) cut into `parts` near-equal pieces on multiples of `granule`.
int64_t SplitPoint(int64_t total, int64_t parts, int64_t part, int64_t granule) {
  if (part >= parts) return total;
  return total * part / parts / granule * granule;
}

// Rows [i0, i1) of x against weight rows [j0, j1): blocks of at most kNcMax weight rows, each
// packed kKc columns at a time.
void RunTask(const Job& job, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  thread_local AlignedScratch scratch;  // weight panels
  float* panels = scratch.Get(kKc * kNcMax);
  const int64_t n_sub = (j1 - j0 + kNcMax - 1) / kNcMax;
  for (int64_t sb = 0; sb < n_sub; ++sb) {
    const int64_t s0 = j0 + SplitPoint(j1 - j0, n_sub, sb, kNr);
    const int64_t s1 = j0 + SplitPoint(j1 - j0, n_sub, sb + 1, kNr);
    const int64_t n_panels = (s1 - s0 + kNr - 1) / kNr;
    for (int64_t k0 = 0; k0 < job.n_in; k0 += kKc) {
      const int64_t kc = std::min(kKc, job.n_in - k0);
      job.pack(job.w, job.ldw, s0, s1, k0, kc, panels);
      for (int64_t i = i0; i < i1; i += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, i1 - i));
        const MicroKernelFn kernel = kMicroKernels[mr - 1];
        const float* xr[kMr];
        for (int r = 0; r < mr; ++r) xr[r] = job.x + (i + r) * job.ldx + k0;
        for (int64_t p = 0; p < n_panels; ++p) {
          const int64_t j = s0 + p * kNr;
          const int nr = static_cast<int>(std::min<int64_t>(kNr, s1 - j));
          kernel(kc, xr, panels + p * kc * kNr, job.y + i * job.ldy + j, job.ldy, nr, k0 > 0);
        }
      }
    }
  }
}

}  // namespace

void TiledTask(const float* x, int64_t ldx, const WeightView& w, int64_t i0, int64_t i1,
               int64_t j0, int64_t j1, float* y, int64_t ldy) {
  if (w.layout == WeightLayout::kPanels16) {
    const Job job{x, i1, ldx, w.data, (w.n_in + 1) / 2, w.n_in, j0, j1, y, ldy, 1, 1, &PackFromPanels};
    RunTask(job, i0, i1, j0, j1);
    return;
  }
  const Job job{x, i1, ldx, w.data, w.ld, w.n_in, j0, j1, y, ldy, 1, 1,
                w.dtype == DType::kBF16 ? &PackAny<uint16_t> : &PackAny<float>};
  RunTask(job, i0, i1, j0, j1);
}

}  // namespace pdserve::kernels::internal::avx2
