// The tiled path of Gemm (m > kGemmSmallMMax): the FMA units, not memory, set the pace.
//
// Two variants, chosen by m, giving the same bits: each output is one sequential fp32 FMA chain
// over k = 0 .. n_in-1 (partial sums written after a k block are reloaded exactly), so results
// are independent of the variant, the task split and m.
//
// GemmTiledPanels (large m): the output is cut into a few balanced tasks per thread (rows of x x
// weight rows). A task takes its weight rows kNcMax at a time and walks k in blocks of kKc; per
// block it converts and transposes those rows into a thread-local panel buffer laid out
// [panel of 16 rows][k][16] (fp32, zero-padded past the last row), then for every 6 rows of x
// runs the 6x16 microkernel over each panel: 12 ymm accumulators, per k two panel loads and six
// broadcasts of x straight from x's rows (x is not packed: its 6 x kKc block sits in L1 while the
// panels stream from L2). The last rows use a microkernel with fewer rows.
//
// GemmTiledPackX (moderate m): x is packed once per call and the weights are broadcast in place
// (see below): packing W would cost about as much as the m FMAs each weight gets.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "common/check.h"
#include "kernels/gemm_internal.h"
#include "kernels/gemm_simd.h"

namespace pdserve::kernels::internal {
namespace {

constexpr int kMr = 6;    // rows of x per microkernel
constexpr int kNr = 16;   // weight rows (outputs) per microkernel: two ymm
// Blocking, chosen with bench/gemm on the 2-core AMD EPYC (Zen 5, 48 KiB L1d, 1 MiB L2) VM: a
// panel buffer of kKc x kNcMax fp32 = 256 KiB stays in L2. kKc = 512 / kNcMax = 128 beat 256 / 256
// and 8 other pairs at m = 16-48 by 3-10% (fewer partial-sum passes) and tied at m = 512.
constexpr int64_t kKc = 512;
constexpr int64_t kNcMax = 128;
constexpr int kTasksPerThread = 4;
// m range in which the tiled path packs x instead of the weights (GemmTiledPackX): there it ran
// 1.05-1.35x the panel variant (m = 16: F32 71 -> 96-120, BF16 88 -> 102-120 GFLOP/s on one
// core); below 12 rows its 8-row granularity wastes too much, above 128 the packed x (m * n_in
// floats) no longer stays in cache (bench/gemm --threads 1 --cpu-time, Zen 5 VM).
constexpr int64_t kPackXMinM = 12;
constexpr int64_t kPackXMaxM = 128;

#if defined(__AVX2__)
// In-register 8x8 transpose: r[t][c] -> r[c][t].
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
#endif

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

// Number of parts (<= max_parts) to cut `units` equal work units into for n_threads threads that
// take parts dynamically: minimizes the work of the busiest thread, ceil(parts / n_threads) *
// ceil(units / parts), preferring more parts on ties (36 panels on 2 threads: 6 parts of 6, not
// 8 parts of 4-5, which cost 9% at n_out = 576).
int64_t BalancedParts(int64_t units, int n_threads, int64_t max_parts) {
  int64_t best = 1, best_load = units;
  for (int64_t p = 1; p <= std::min(units, max_parts); ++p) {
    const int64_t load = (p + n_threads - 1) / n_threads * ((units + p - 1) / p);
    if (load <= best_load) {
      best = p;
      best_load = load;
    }
  }
  return best;
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

void RunTaskIndex(const Job& job, int64_t t) {
  const int64_t mi = t / job.nb, ni = t % job.nb;
  const int64_t n = job.j_end - job.j_begin;
  RunTask(job, SplitPoint(job.m, job.mb, mi, kMr), SplitPoint(job.m, job.mb, mi + 1, kMr),
          job.j_begin + SplitPoint(n, job.nb, ni, kNr),
          job.j_begin + SplitPoint(n, job.nb, ni + 1, kNr));
}

// ---- x-packed variant for moderate m ----------------------------------------------------------
// At m up to ~64 packing W (transposes, ~0.3 cycles per weight) costs as much as a good part of
// the m FMAs each weight gets. This variant swaps the roles: x (small here) is packed once per
// call into [16 rows][k][16], and 6 weight rows at a time are broadcast straight from W (F32) or
// from a bf16 -> fp32 copy of those 6 rows (no transpose). Every output is still one sequential
// FMA chain over k from 0, so it gives the same bits as the panel variant above.
constexpr int kXr = 16;  // x rows per microkernel (two ymm)
constexpr int kWr = 6;   // weight rows per microkernel (broadcasts)

// y[i * ldy + r] = sum_{k < n_in} xp[k * kXr + i] * wr[r][k] for i < mr, r < NW, with V ymm of
// x rows (V = 1: the rows 0-7 of the block only). T = uint16_t: bf16 weights, widened in the
// broadcast (the dword ending at w[k] broadcast, its low half masked off: two cheap ops; k = 0
// is peeled so nothing before the row is read).
template <typename T, int V, int NW>
void XMicroKernel(int64_t n_in, const float* xp, const T* const* wr, float* y, int64_t ldy,
                  int mr) {
  alignas(32) float t[NW][8 * V];
#if defined(__AVX2__)
  __m256 c[NW][V];
  const T* w[NW];
#pragma GCC unroll 8
  for (int r = 0; r < NW; ++r) w[r] = wr[r];
  // k = 0 (the chains start at fma(x0, w0, 0)).
  {
    __m256 a[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) a[v] = _mm256_load_ps(xp + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < NW; ++r) {
      const __m256 b = _mm256_set1_ps(WeightToF32(w[r]));
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) c[r][v] = _mm256_fmadd_ps(a[v], b, _mm256_setzero_ps());
    }
  }
  const __m256 hi_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  for (int64_t k = 1; k < n_in; ++k) {
    __m256 a[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) a[v] = _mm256_load_ps(xp + k * kXr + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < NW; ++r) {
      __m256 b;
      if constexpr (sizeof(T) == 4) {
        b = _mm256_broadcast_ss(reinterpret_cast<const float*>(w[r]) + k);
      } else {
        uint32_t u;
        std::memcpy(&u, w[r] + k - 1, 4);
        b = _mm256_and_ps(_mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(u))), hi_mask);
      }
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) c[r][v] = _mm256_fmadd_ps(a[v], b, c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < NW; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm256_store_ps(&t[r][8 * v], c[r][v]);
  }
#else
  for (int r = 0; r < NW; ++r) {
    for (int i = 0; i < 8 * V; ++i) {
      float s = 0.0f;
      for (int64_t k = 0; k < n_in; ++k) s = std::fma(xp[k * kXr + i], WeightToF32(wr[r] + k), s);
      t[r][i] = s;
    }
  }
#endif
  for (int i = 0; i < mr; ++i) {
    for (int r = 0; r < NW; ++r) y[i * ldy + r] = t[r][i];
  }
}

template <typename T>
using XMicroKernelFn = void (*)(int64_t, const float*, const T* const*, float*, int64_t, int);
template <typename T, int V, int... Ns>
constexpr std::array<XMicroKernelFn<T>, kWr> XKernelRow(std::integer_sequence<int, Ns...>) {
  return {&XMicroKernel<T, V, Ns + 1>...};
}
// kXMicroKernels<T>[V - 1][nw - 1].
template <typename T>
constexpr std::array<std::array<XMicroKernelFn<T>, kWr>, 2> kXMicroKernels = {
    XKernelRow<T, 1>(std::make_integer_sequence<int, kWr>{}),
    XKernelRow<T, 2>(std::make_integer_sequence<int, kWr>{})};

struct XJob {
  const float* xp;  // packed x: ceil(m / kXr) blocks of [n_in][kXr]
  int64_t m;
  const void* w;
  DType dtype;
  int64_t ldw, n_in;
  int64_t j_begin, j_end;
  float* y;
  int64_t ldy;
  int64_t n_tasks;
};

// Weight rows [j0, j1) against all rows of x.
template <typename T>
void RunXTask(const XJob& job, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += kWr) {
    const int nw = static_cast<int>(std::min<int64_t>(kWr, j1 - j));
    const T* wr[kWr];
    for (int r = 0; r < nw; ++r) wr[r] = static_cast<const T*>(job.w) + (j + r) * job.ldw;
    for (int64_t i = 0; i < job.m; i += kXr) {
      const int mr = static_cast<int>(std::min<int64_t>(kXr, job.m - i));
      kXMicroKernels<T>[mr > 8 ? 1 : 0][nw - 1](job.n_in, job.xp + i * job.n_in, wr,
                                                 job.y + i * job.ldy + j, job.ldy, mr);
    }
  }
}

void RunXTaskIndex(const XJob& job, int64_t t) {
  const int64_t n = job.j_end - job.j_begin;
  const int64_t j0 = job.j_begin + SplitPoint(n, job.n_tasks, t, kWr);
  const int64_t j1 = job.j_begin + SplitPoint(n, job.n_tasks, t + 1, kWr);
  if (job.dtype == DType::kBF16) {
    RunXTask<uint16_t>(job, j0, j1);
  } else {
    RunXTask<float>(job, j0, j1);
  }
}

}  // namespace

void GemmTiledPackX(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
                    int64_t j_end, float* y, int64_t ldy, ThreadPool* pool) {
  const int n_threads = pool == nullptr ? 1 : pool->n_threads();
  const int64_t n = j_end - j_begin;
  // x packed by the calling thread, read by all tasks while ParallelFor blocks.
  thread_local AlignedScratch x_scratch;
  const int64_t n_blocks = (m + kXr - 1) / kXr;
  float* xp = x_scratch.Get(n_blocks * kXr * w.n_in);
  PackPanels(x, ldx, 0, m, 0, w.n_in, xp);
  const int64_t n_tasks =
      n_threads == 1 ? 1
                     : BalancedParts((n + kWr - 1) / kWr, n_threads,
                                     int64_t{n_threads} * kTasksPerThread);
  const XJob job{xp, m, w.data, w.dtype, w.ld, w.n_in, j_begin, j_end, y, ldy, n_tasks};
  if (n_tasks == 1) {
    RunXTaskIndex(job, 0);
    return;
  }
  // Captures one pointer so std::function stores it inline (no allocation).
  pool->ParallelFor(n_tasks, [jp = &job](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) RunXTaskIndex(*jp, t);
  });
}

void GemmTiledPanels(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
                     int64_t j_end, float* y, int64_t ldy, ThreadPool* pool) {
  const int n_threads = pool == nullptr ? 1 : pool->n_threads();
  const int64_t n = j_end - j_begin;
  // Up to kTasksPerThread balanced tasks per thread, one per ParallelFor chunk. Split n first
  // (each weight row is then packed by one task only), m too when n is too narrow.
  int64_t nb = 1, mb = 1;
  if (n_threads > 1) {
    const int64_t target = int64_t{n_threads} * kTasksPerThread;
    nb = BalancedParts((n + kNr - 1) / kNr, n_threads, target);
    if (nb < 2 * n_threads) mb = std::clamp<int64_t>(m / (4 * kMr), 1, target / nb);
  }
  const Job job{x, m, ldx, w.data, w.ld, w.n_in, j_begin, j_end, y, ldy, mb, nb,
                w.dtype == DType::kBF16 ? &PackAny<uint16_t> : &PackAny<float>};
  const int64_t n_tasks = mb * nb;
  if (n_tasks == 1) {
    RunTaskIndex(job, 0);
    return;
  }
  // Captures one pointer so std::function stores it inline (no allocation).
  pool->ParallelFor(n_tasks, [jp = &job](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) RunTaskIndex(*jp, t);
  });
}

void GemmTiled(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
               int64_t j_end, float* y, int64_t ldy, ThreadPool* pool) {
  if (m >= kPackXMinM && m <= kPackXMaxM) {
    GemmTiledPackX(x, m, ldx, w, j_begin, j_end, y, ldy, pool);
  } else {
    GemmTiledPanels(x, m, ldx, w, j_begin, j_end, y, ldy, pool);
  }
}

}  // namespace pdserve::kernels::internal
