// Entry points of kernels/gemm_int8.h: argument checks, widening x to int16, task planning
// over one or many GEMMs (grouped), and the weight-streaming decode path.
//
// Decode path: a block computes M x-rows against R weight rows with M*R int32 accumulators
// (<= 12, so they, one widened weight vector and one x vector fit the 16 ymm registers). Per 16
// k: one 16-byte load + sign extension per weight row, one vpmaddwd + vpaddd per (row, x-row).
#include "kernels/gemm_int8.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/check.h"
#include "kernels/gemm_int8_internal.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pdserve::kernels {
namespace internal {
namespace {

// Weight rows per block for M x-rows (1..4); m > 4 goes in groups of 4 rows.
constexpr int kRowsForM[5] = {0, 8, 4, 4, 3};
constexpr int kGroupM = 4;
// Prefetched next blocks up to this size go to L1 (48 KiB on the Zen 5 VM), larger ones to L2.
constexpr int64_t kPrefetchL1Bytes = 16 << 10;
// Minimum multiply-adds per decode task: below ~64K a ParallelFor hand-off costs more than it
// saves (bench/w8a8, decode shapes).
constexpr int64_t kMinMacsPerTask = 65536;

#if defined(__AVX2__)
inline int32_t Hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}
#endif

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

// Everything a parallel region needs, in the calling thread's storage.
struct Plan {
  Int8Problem p;
  bool tiled = false;
  bool widen = false;  // first user of its widened x rows
  int64_t mc = 0, nc = 0, nb = 0;  // task grid: rows x columns per task, tasks along n
  int64_t task_begin = 0;
};

// Grow-only, 64-byte aligned int16 storage (the widened x rows are loaded with aligned loads).
class AlignedI16 {
 public:
  int16_t* Get(int64_t n) {
    if (n > capacity_) {
      const size_t bytes = (static_cast<size_t>(n) * 2 + 63) & ~size_t{63};
      data_.reset(static_cast<int16_t*>(std::aligned_alloc(64, bytes)));
      PDSERVE_CHECK(data_ != nullptr, "GemmInt8: scratch allocation");
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

struct CallScratch {
  AlignedI16 x16;
  std::vector<Plan> plans;
  std::vector<int64_t> x16_offset;
};

void RunTask(const std::vector<Plan>& plans, int64_t task) {
  // The plan holding `task`: the last one whose task_begin <= task.
  auto it = std::upper_bound(plans.begin(), plans.end(), task,
                             [](int64_t t, const Plan& pl) { return t < pl.task_begin; });
  const Plan& pl = *(it - 1);
  const int64_t local = task - pl.task_begin;
  const int64_t i0 = (local / pl.nb) * pl.mc, j0 = (local % pl.nb) * pl.nc;
  const int64_t i1 = std::min(pl.p.m, i0 + pl.mc), j1 = std::min(pl.p.w.n_out, j0 + pl.nc);
  if (pl.tiled) {
    GemmInt8Tiled(pl.p, i0, i1, j0, j1);
  } else {
    GemmInt8SmallM(pl.p, i0, i1, j0, j1);
  }
}

void ZeroOutput(void* y, int64_t m, int64_t n, int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) std::memset(static_cast<uint8_t*>(y) + i * ldy * 4, 0, static_cast<size_t>(n) * 4);
}

// The shared driver: groups given as problems with int8 x still to widen.
struct Src {
  const int8_t* xq;
  int64_t ldx;
};

void Run(const Int8Problem* problems, const Src* srcs, int64_t n, ThreadPool* pool) {
  thread_local CallScratch cs;
  const int n_threads = pool == nullptr ? 1 : pool->n_threads();
  cs.plans.clear();
  cs.x16_offset.assign(static_cast<size_t>(n), -1);
  int64_t x16_total = 0;
  for (int64_t g = 0; g < n; ++g) {
    const Int8Problem& p = problems[g];
    PDSERVE_CHECK(p.w.n_in <= kGemmInt8MaxK, "GemmInt8: n_in exceeds kGemmInt8MaxK");
    PDSERVE_DCHECK(srcs[g].ldx >= p.w.n_in && p.ldy >= p.w.n_out && p.w.ld >= p.w.n_in, "GemmInt8: strides");
    if (p.m <= 0 || p.w.n_out <= 0) continue;
    if (p.w.n_in == 0) {
      ZeroOutput(p.y, p.m, p.w.n_out, p.ldy);
      continue;
    }
    Plan pl;
    // Adjacent groups reading the same x rows (gate/up of one expert) share one widened copy.
    const int64_t h = g - 1;
    if (h >= 0 && cs.x16_offset[h] >= 0 && srcs[h].xq == srcs[g].xq && srcs[h].ldx == srcs[g].ldx &&
        problems[h].m == p.m && problems[h].w.n_in == p.w.n_in) {
      cs.x16_offset[g] = cs.x16_offset[h];
    } else {
      cs.x16_offset[g] = x16_total;
      x16_total += p.m * WidenedStride(p.w.n_in);
      pl.widen = true;
    }
    pl.p = p;
    pl.p.ldx16 = WidenedStride(p.w.n_in);
    pl.tiled = p.m > kGemmInt8SmallMMax;
    if (pl.tiled) {
      TiledTaskGrid(p.m, p.w.n_out, n_threads, &pl.mc, &pl.nc);
    } else {
      pl.mc = p.m;
      const int64_t macs_per_col = p.m * p.w.n_in;
      int64_t nc = std::max<int64_t>((p.w.n_out + 4 * n_threads - 1) / (4 * n_threads),
                                     (kMinMacsPerTask + macs_per_col - 1) / macs_per_col);
      pl.nc = std::min(p.w.n_out, (nc + 7) / 8 * 8);
    }
    pl.nb = (p.w.n_out + pl.nc - 1) / pl.nc;
    pl.task_begin = g;  // patched below (index of the source group for now)
    cs.plans.push_back(pl);
  }
  if (cs.plans.empty()) return;
  // Every widened row starts 32-byte aligned: the base is, and offsets are multiples of 16.
  int16_t* base = cs.x16.Get(x16_total);
  int64_t n_tasks = 0;
  for (Plan& pl : cs.plans) {
    const int64_t g = pl.task_begin;
    int16_t* x16 = base + cs.x16_offset[g];
    if (pl.widen) WidenRows(srcs[g].xq, pl.p.m, pl.p.w.n_in, srcs[g].ldx, x16, pl.p.ldx16);
    pl.p.x16 = x16;
    pl.task_begin = n_tasks;
    n_tasks += ((pl.p.m + pl.mc - 1) / pl.mc) * pl.nb;
  }
  const std::vector<Plan>* plans = &cs.plans;
  if (n_threads == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) RunTask(*plans, t);
    return;
  }
  pool->ParallelFor(n_tasks, [plans](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) RunTask(*plans, t);
  });
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
  int32_t acc[kGroupM][8];
  for (int64_t i = i_begin; i < i_end; i += kGroupM) {
    const int mg = static_cast<int>(std::min<int64_t>(kGroupM, i_end - i));
    const int rows = i_end - i_begin > kGroupM ? kRowsForM[kGroupM] : kRowsForM[mg];
    for (int64_t j = j_begin; j < j_end; j += rows) {
      const int r = static_cast<int>(std::min<int64_t>(rows, j_end - j));
      // The next block's rows (none after the slice's last block).
      const int64_t jn = std::min(j + rows, j_end), rn = std::min<int64_t>(rows, j_end - jn);
      const int8_t* next = w.data + jn * w.ld;
      Block(mg, r)(p.x16 + i * p.ldx16, p.ldx16, w.data + j * w.ld, w.ld, w.n_in, acc, next,
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

}  // namespace internal

void GemmInt8(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx,
              const Int8WeightView& w, float* y, int64_t ldy, ThreadPool* pool) {
  internal::Int8Problem p;
  p.x_scales = x_scales;
  p.m = m;
  p.w = w;
  p.y = y;
  p.ldy = ldy;
  const internal::Src src{xq, ldx};
  internal::Run(&p, &src, 1, pool);
}

void GemmInt8Acc(const int8_t* xq, int64_t m, int64_t ldx, const Int8WeightView& w,
                 int32_t* acc, int64_t ldacc, ThreadPool* pool) {
  internal::Int8Problem p;
  p.m = m;
  p.w = w;
  p.y = acc;
  p.ldy = ldacc;
  p.raw = true;
  const internal::Src src{xq, ldx};
  internal::Run(&p, &src, 1, pool);
}

void GroupedGemmInt8(const Int8GemmGroup* groups, int64_t n_groups, ThreadPool* pool) {
  thread_local std::vector<internal::Int8Problem> problems;
  thread_local std::vector<internal::Src> srcs;
  problems.resize(static_cast<size_t>(n_groups));
  srcs.resize(static_cast<size_t>(n_groups));
  for (int64_t g = 0; g < n_groups; ++g) {
    internal::Int8Problem& p = problems[static_cast<size_t>(g)];
    p = internal::Int8Problem{};
    p.x_scales = groups[g].x_scales;
    p.m = groups[g].m;
    p.w = groups[g].w;
    p.y = groups[g].y;
    p.ldy = groups[g].ldy;
    srcs[static_cast<size_t>(g)] = {groups[g].xq, groups[g].ldx};
  }
  internal::Run(problems.data(), srcs.data(), n_groups, pool);
}

int32_t DotInt8(const int8_t* a, const int8_t* b, int64_t n) {
  int64_t k = 0;
  int32_t s = 0;
#if defined(__AVX2__)
  __m256i acc = _mm256_setzero_si256();
  for (; k + 16 <= n; k += 16) {
    const __m256i av = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k)));
    const __m256i bv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(av, bv));
  }
  s = internal::Hsum(acc);
#endif
  for (; k < n; ++k) s += int32_t{a[k]} * b[k];
  return s;
}

}  // namespace pdserve::kernels
