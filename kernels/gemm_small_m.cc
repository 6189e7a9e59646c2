// The decode path of Gemm: m is small, so the weight matrix is streamed from memory once and
// every weight vector loaded is FMA'd against all m rows of x before it is dropped.
//
// A block computes M x-rows against R weight rows: M*R 8-lane accumulators (kept <= 12 so they
// and a loaded weight vector stay in the 16 ymm registers; >= 8 independent chains hide the FMA
// latency). For m > 4 the x rows go in near-equal groups of at most 4 (5 = 3 + 2, 7 = 4 + 3)
// over the same R weight rows, which are then still in L1 for the later groups.
// Every output's arithmetic is the same whatever M, R or the block it falls in, so results do not
// depend on the thread split or the slice.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/gemm_internal.h"
#include "kernels/gemm_simd.h"

namespace pdserve::kernels::internal {
namespace {

// Weight rows per block for a largest group of M x-rows (M = 1..4): M*R accumulators <= 12, and
// >= 8 in every group given that group sizes differ by at most one, except m = 1: a lone x row
// is memory-bound, and 4 weight streams ran 5-10% faster from DRAM than 8 (bench/gemm
// --threads 1 --cpu-time, Zen 5 VM).
constexpr int kRowsForM[5] = {0, 4, 4, 4, 3};
constexpr int kMaxRows = 4;
constexpr int kGroupM = 4;

// Work (MACs) per thread chunk below which splitting is not worth a ParallelFor hand-off
// (~32K MACs, a few microseconds).
constexpr int64_t kMinMacsPerChunk = 32768;

// Software prefetch of the weight rows at least this far ahead (and at least one block ahead),
// one prefetch per cache line, into L2 (_MM_HINT_T1). Without it a decode step on the 2-core
// Zen 5 VM stalls on DRAM: m = 4 ran at ~0.5x the single-thread read bandwidth, m = 1 BF16 at
// ~0.7x; with it both reach it (bench/gemm, --threads 1; distances 1 block .. 32 KiB and the T0
// hint measured within noise of each other).
constexpr int64_t kPrefetchAheadBytes = 8192;

// y[i * ldy + r] = sum_k x[i * ldx + k] * w[r * ldw + k] for i < M, r < R.
// next: address of weight rows further on (prefetched while this block is computed), same
// stride; an integer since it may lie past the matrix (prefetches never fault).
template <int M, int R, typename T>
void DotBlock(const float* x, int64_t ldx, const T* w, int64_t ldw, int64_t n_in, float* y,
              int64_t ldy, uintptr_t next) {
  const int64_t n_vec = n_in & ~int64_t{7};
  float sums[M][R];
#if defined(__AVX2__)
  __m256 acc[M][R];
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
  }
  auto step = [&](int64_t k) __attribute__((always_inline)) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 wv = LoadW8(w + r * ldw + k);
#pragma GCC unroll 16
      for (int i = 0; i < M; ++i) {
        acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * ldx + k), wv, acc[i][r]);
      }
    }
  };
  constexpr int64_t kLine = 64 / sizeof(T);  // elements per cache line
  int64_t k = 0;
  for (; k + kLine <= n_vec; k += kLine) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      PrefetchL2(next + (r * ldw + k) * sizeof(T));
    }
#pragma GCC unroll 4
    for (int64_t kk = 0; kk < kLine; kk += 8) step(k + kk);
  }
  for (; k < n_vec; k += 8) step(k);
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < R; ++r) sums[i][r] = Hsum8(acc[i][r]);
  }
#else
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < R; ++r) {
      float lanes[8] = {};
      for (int64_t k = 0; k < n_vec; k += 8) {
        for (int l = 0; l < 8; ++l) {
          lanes[l] = std::fma(x[i * ldx + k + l], WeightToF32(w + r * ldw + k + l), lanes[l]);
        }
      }
      sums[i][r] = HsumLanes(lanes);
    }
  }
#endif
  for (int i = 0; i < M; ++i) {
    for (int r = 0; r < R; ++r) {
      float s = sums[i][r];
      for (int64_t k = n_vec; k < n_in; ++k) {
        s = std::fma(x[i * ldx + k], WeightToF32(w + r * ldw + k), s);
      }
      y[i * ldy + r] = s;
    }
  }
}

template <typename T>
using BlockFn = void (*)(const float*, int64_t, const T*, int64_t, int64_t, float*, int64_t,
                         uintptr_t);

// kBlockTable<T>[M - 1][R - 1] = DotBlock<M, R, T>.
template <typename T, int M, int... Rs>
constexpr std::array<BlockFn<T>, kMaxRows> RowFns(std::integer_sequence<int, Rs...>) {
  return {&DotBlock<M, Rs + 1, T>...};
}
template <typename T>
constexpr std::array<std::array<BlockFn<T>, kMaxRows>, kGroupM> kBlockTable = {
    RowFns<T, 1>(std::make_integer_sequence<int, kMaxRows>{}),
    RowFns<T, 2>(std::make_integer_sequence<int, kMaxRows>{}),
    RowFns<T, 3>(std::make_integer_sequence<int, kMaxRows>{}),
    RowFns<T, 4>(std::make_integer_sequence<int, kMaxRows>{})};

struct Job {
  const float* x;
  int64_t m, ldx;
  const void* w;
  int64_t ldw, n_in;
  int64_t j_begin, j_end;
  float* y;
  int64_t ldy;
  int64_t n_groups;  // groups of x rows, sizes m / n_groups rounded up for the first m % n_groups
  int rows;          // weight rows per block
  void (*run)(const Job&, int64_t, int64_t);
};

// Weight rows [job.j_begin + b0 * rows, ... + b1 * rows) clipped to j_end.
template <typename T>
void RunBlocks(const Job& job, int64_t b0, int64_t b1) {
  const T* w = static_cast<const T*>(job.w);
  const int64_t j_lo = job.j_begin + b0 * job.rows;
  const int64_t j_hi = std::min(job.j_end, job.j_begin + b1 * job.rows);
  const int64_t row_bytes = job.n_in * static_cast<int64_t>(sizeof(T));
  const int64_t ahead =
      std::max<int64_t>(job.rows, (kPrefetchAheadBytes + row_bytes - 1) / row_bytes);
  for (int64_t j = j_lo; j < j_hi; j += job.rows) {
    const int r = static_cast<int>(std::min<int64_t>(job.rows, j_hi - j));
    for (int64_t g = 0, i = 0; g < job.n_groups; ++g) {
      const int mg = static_cast<int>(job.m / job.n_groups + (g < job.m % job.n_groups ? 1 : 0));
      kBlockTable<T>[mg - 1][r - 1](job.x + i * job.ldx, job.ldx, w + j * job.ldw, job.ldw,
                                    job.n_in, job.y + i * job.ldy + j, job.ldy,
                                    reinterpret_cast<uintptr_t>(w + j * job.ldw) +
                                        ahead * job.ldw * sizeof(T));
      i += mg;
    }
  }
}

}  // namespace

void GemmSmallM(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
                int64_t j_end, float* y, int64_t ldy, ThreadPool* pool) {
  // Every weight vector is FMA'd against vectors of x loaded from memory, so x rows that are not
  // 32-byte aligned (a split load every other vector) cost ~20% at m >= 4 (bench/gemm, Zen 5):
  // such x is first copied into the calling thread's aligned scratch (m * n_in floats, cheap
  // next to the m * n_in * n_out FMAs), which the workers read while ParallelFor blocks.
  if ((reinterpret_cast<uintptr_t>(x) | static_cast<uintptr_t>(ldx * sizeof(float))) % 32 != 0) {
    thread_local AlignedScratch x_copy;
    const int64_t ld = (w.n_in + 7) & ~int64_t{7};
    float* xa = x_copy.Get(m * ld);
    for (int64_t i = 0; i < m; ++i) std::memcpy(xa + i * ld, x + i * ldx, w.n_in * sizeof(float));
    x = xa;
    ldx = ld;
  }
  const int64_t n_groups = (m + kGroupM - 1) / kGroupM;
  const int64_t largest_group = (m + n_groups - 1) / n_groups;
  const Job job{x, m, ldx, w.data, w.ld, w.n_in, j_begin, j_end, y, ldy, n_groups,
                kRowsForM[largest_group],
                w.dtype == DType::kBF16 ? &RunBlocks<uint16_t> : &RunBlocks<float>};
  const int64_t n_blocks = (j_end - j_begin + job.rows - 1) / job.rows;
  if (pool == nullptr || pool->n_threads() == 1) {
    job.run(job, 0, n_blocks);
    return;
  }
  const int64_t macs_per_block = job.rows * w.n_in * m;
  const int64_t min_chunk = std::max<int64_t>(1, kMinMacsPerChunk / macs_per_block);
  // Captures one pointer so std::function stores it inline (no allocation).
  const auto fn = [jp = &job](int64_t b0, int64_t b1) { jp->run(*jp, b0, b1); };
  pool->ParallelFor(n_blocks, fn, min_chunk);
}

}  // namespace pdserve::kernels::internal
