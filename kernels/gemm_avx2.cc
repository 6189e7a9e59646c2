// The avx2 level's fp32-activation GEMM kernels (F32 and BF16 weights); also the kernels of the
// wider levels for F32 weights and for rows of x that are not bf16-exact. Baseline flags.
//
// The summation order of every level (kernels/gemm.h): each output is ONE sequential fp32 FMA
// chain over k = 0 .. n_in-1, starting from +0. So m, the task split and the kernel chosen
// never change a bit, and a row computed alone (decode) equals the same row in any batch.
//
// Two kernels give that order:
//   * tasks of >= kTiledMinRows rows of x: the tiled path (gemm_avx2_tiled.cc): weight panels
//     transposed once per task into L2, a 6x16 microkernel, FMA-bound;
//   * fewer rows (decode): the weights stream from memory once. Per block of 8 weight rows x 8
//     k, the rows are widened to fp32 and transposed in registers (4 128-bit loads with
//     inserts, 8 unpacks to fp32, two 4x4 transposes: 24 shuffles per 64 weights), then each x
//     row's 8 outputs advance their chains by 8 FMAs with x[k] broadcast. Up to 4 blocks are in
//     flight so the chains (4-cycle FMA latency) overlap. The n_in mod 8 tail is one more step
//     on zero-padded copies: a chain that starts at +0 never becomes -0, so adding 0 * 0 leaves
//     it unchanged.
#include <immintrin.h>

#include <cstring>

#include "kernels/gemm_plan.h"
#include "kernels/isa_kernels.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "gemm_avx2.cc needs -mavx2 -mfma"
#endif

namespace pdserve::kernels::internal::avx2 {

// gemm_avx2_tiled.cc: outputs [j0, j1) of x rows [i0, i1) (x rows of stride ldx); for
// kPanels16 weights j0 is a multiple of 16.
void TiledTask(const float* x, int64_t ldx, const WeightView& w, int64_t i0, int64_t i1,
               int64_t j0, int64_t j1, float* y, int64_t ldy);

namespace {

constexpr int64_t kStep = 8;
int64_t PaddedK(int64_t n_in) { return (n_in + kStep - 1) / kStep * kStep; }

// Tasks with at least this many rows of x take the tiled path: below it the panel transposes
// cost more than the streaming kernel's in-register ones (bench/gemm --only crossover).
constexpr int64_t kTiledMinRows = 12;
// Streaming kernel: x rows per block (M <= 4) and blocks of 8 weight rows in flight, so that
// M * blocks >= 4 independent chains cover the FMA latency.
constexpr int kMaxM = 4;

// The 8 k-vectors (8 outputs each, fp32) of 8 weight rows x 8 k starting at w (row stride ld).
inline void TransposeBlock(const uint16_t* w, int64_t ld, __m256 out[8]) {
  const __m256i z = _mm256_setzero_si256();
  __m256 lo[4], hi[4];
  for (int r = 0; r < 4; ++r) {
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * ld))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (r + 4) * ld)), 1);
    lo[r] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));  // [row r k0-3 | row r+4 k0-3]
    hi[r] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));  // [row r k4-7 | row r+4 k4-7]
  }
  for (int h = 0; h < 2; ++h) {
    const __m256* q = h == 0 ? lo : hi;
    const __m256 t0 = _mm256_unpacklo_ps(q[0], q[1]), t1 = _mm256_unpackhi_ps(q[0], q[1]);
    const __m256 t2 = _mm256_unpacklo_ps(q[2], q[3]), t3 = _mm256_unpackhi_ps(q[2], q[3]);
    out[4 * h + 0] = _mm256_shuffle_ps(t0, t2, 0x44);
    out[4 * h + 1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    out[4 * h + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
    out[4 * h + 3] = _mm256_shuffle_ps(t1, t3, 0xEE);
  }
}
inline void TransposeBlock(const float* w, int64_t ld, __m256 out[8]) {
  __m256 lo[4], hi[4];
  for (int r = 0; r < 4; ++r) {
    lo[r] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(w + r * ld)),
                                 _mm_loadu_ps(w + (r + 4) * ld), 1);
    hi[r] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(w + r * ld + 4)),
                                 _mm_loadu_ps(w + (r + 4) * ld + 4), 1);
  }
  for (int h = 0; h < 2; ++h) {
    const __m256* q = h == 0 ? lo : hi;
    const __m256 t0 = _mm256_unpacklo_ps(q[0], q[1]), t1 = _mm256_unpackhi_ps(q[0], q[1]);
    const __m256 t2 = _mm256_unpacklo_ps(q[2], q[3]), t3 = _mm256_unpackhi_ps(q[2], q[3]);
    out[4 * h + 0] = _mm256_shuffle_ps(t0, t2, 0x44);
    out[4 * h + 1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    out[4 * h + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
    out[4 * h + 3] = _mm256_shuffle_ps(t1, t3, 0xEE);
  }
}

// Outputs [j, j + 8 * NB) (rows past j1 computed on zero copies and not stored) for x rows
// [i, i + M): chains over all of k. pf..pf_end: the next block's weights, prefetched into L2
// spread over the k loop (rows of a few KiB are too short for the hardware prefetcher).
template <typename T, int M, int NB>
void StreamBlock(const float* x, int64_t kp, const T* w, int64_t ld, int64_t n_in, int n_rows,
                 float* y, int64_t ldy, const char* pf, const char* pf_end) {
  __m256 acc[NB][M];
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) acc[b][i] = _mm256_setzero_ps();
  }
  // Rows past n_rows (the slice's end) and the k tail read zero-padded copies.
  alignas(32) T pad[NB * 8][kStep];
  const int64_t n_full = n_rows == 8 * NB ? n_in / kStep * kStep : 0;
  const int64_t steps = n_full / kStep;
  const int64_t lines = (pf_end - pf + 63) / 64;
  const int64_t lines_per_step = steps > 0 ? (lines + steps - 1) / steps : 0;
  auto step = [&](const T* wb, int64_t ldb, int64_t k) __attribute__((always_inline)) {
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) {
      __m256 wt[8];
      TransposeBlock(wb + b * 8 * ldb, ldb, wt);
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) {
          acc[b][i] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i * kp + k + t), wt[t], acc[b][i]);
        }
      }
    }
  };
  int64_t k = 0;
  for (; k < n_full; k += kStep) {
    for (int64_t l = 0; l < lines_per_step && pf < pf_end; ++l, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
    step(w + k, ld, k);
  }
  for (; k < n_in; k += kStep) {  // partial rows or k: zero-padded copies, same chains
    const int64_t kn = n_in - k < kStep ? n_in - k : kStep;
    for (int r = 0; r < NB * 8; ++r) {
      std::memset(pad[r], 0, sizeof(pad[r]));
      if (r < n_rows) std::memcpy(pad[r], w + r * ld + k, static_cast<size_t>(kn) * sizeof(T));
    }
    step(&pad[0][0], kStep, k);
  }
  for (int b = 0; b < NB; ++b) {
    for (int i = 0; i < M; ++i) {
      alignas(32) float out[8];
      _mm256_store_ps(out, acc[b][i]);
      const int n = n_rows - 8 * b < 8 ? n_rows - 8 * b : 8;
      for (int r = 0; r < n; ++r) y[i * ldy + 8 * b + r] = out[r];
    }
  }
}

template <typename T>
using StreamFn = void (*)(const float*, int64_t, const T*, int64_t, int64_t, int, float*, int64_t,
                          const char*, const char*);

// Blocks of 8 weight rows in flight per x-row count M: M * NB >= 4 chains.
template <typename T>
StreamFn<T> PickStream(int m, int* nb) {
  switch (m) {
    case 1: *nb = 4; return &StreamBlock<T, 1, 4>;
    case 2: *nb = 2; return &StreamBlock<T, 2, 2>;
    case 3: *nb = 2; return &StreamBlock<T, 3, 2>;
    default: *nb = 1; return &StreamBlock<T, 4, 1>;
  }
}

template <typename T>
void Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t kp = PaddedK(p.w.n_in);
  const float* xp = static_cast<const float*>(p.xp);
  if (i1 - i0 >= kTiledMinRows) {
    TiledTask(xp, kp, p.w, i0, i1, j0, j1, p.y, p.ldy);
    return;
  }
  const T* w = static_cast<const T*>(p.w.data);
  const int64_t ld = p.w.ld, n_in = p.w.n_in;
  // x rows in near-equal groups of at most kMaxM (5 = 3 + 2), each over the same weight block
  // while it is still in L1.
  const int64_t n_groups = (i1 - i0 + kMaxM - 1) / kMaxM;
  int nb_max = 0;
  PickStream<T>(static_cast<int>((i1 - i0 + n_groups - 1) / n_groups), &nb_max);
  const int64_t rows = 8 * nb_max;
  for (int64_t j = j0; j < j1; j += rows) {
    const int n_rows = static_cast<int>(j1 - j < rows ? j1 - j : rows);
    const int64_t jn = j + n_rows, rn = j1 - jn < rows ? j1 - jn : rows;
    const char* pf = reinterpret_cast<const char*>(w + jn * ld);
    const char* pf_end = rn > 0 ? reinterpret_cast<const char*>(w + (jn + rn - 1) * ld + n_in) : pf;
    for (int64_t g = 0, i = i0; g < n_groups; ++g) {
      const int mg = static_cast<int>((i1 - i0) / n_groups + (g < (i1 - i0) % n_groups ? 1 : 0));
      int nb = 0;
      const StreamFn<T> fn = PickStream<T>(mg, &nb);
      for (int64_t jb = j; jb < j + n_rows; jb += 8 * nb) {
        const int nr = static_cast<int>(j + n_rows - jb < 8 * nb ? j + n_rows - jb : 8 * nb);
        fn(xp + i * kp, kp, w + jb * ld, ld, n_in, nr, p.y + i * p.ldy + jb, p.ldy, pf,
           g == 0 && jb == j ? pf_end : pf);
      }
      i += mg;
    }
  }
}

constexpr int64_t kPanelPrefetchPairs = 32;

// kPanels16 weights, M rows of x (1-4) x NP panels: per k pair each panel is two ymm loads of
// 8 outputs' bf16 pairs, turned into fp32 by a shift (k) or a mask (k + 1); no transposes, and
// every weight is read once, in order. M * NP * 2 >= 4 chains cover the FMA latency.
template <int M, int NP>
void PanelBlock(const float* x, int64_t ldx, const uint32_t* w, int64_t pairs, int64_t j,
                int64_t j1, float* y, int64_t ldy) {
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  __m256 acc[NP][2][M];
#pragma GCC unroll 4
  for (int q = 0; q < NP; ++q) {
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) acc[q][0][i] = acc[q][1][i] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < pairs; ++k) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      const uint32_t* src = w + (q * pairs + k) * 16;
      // The panel stream's line kPanelPrefetchPairs ahead, past its end the next block's
      // (gemm_avx512.cc's PanelRowsBlock says why).
      const int64_t ahead = k + kPanelPrefetchPairs;
      const int64_t line = ahead < pairs ? q * pairs + ahead : (NP + q) * pairs + (ahead - pairs);
      _mm_prefetch(reinterpret_cast<const char*>(w + line * 16), _MM_HINT_T0);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + 8 * h));
        const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        const __m256 up = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) {
          acc[q][h][i] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i * ldx + 2 * k), lo, acc[q][h][i]);
          acc[q][h][i] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i * ldx + 2 * k + 1), up, acc[q][h][i]);
        }
      }
    }
  }
  for (int q = 0; q < NP; ++q) {
    for (int h = 0; h < 2; ++h) {
      const int64_t c = j + 16 * q + 8 * h;  // these 8 outputs' first
      const int64_t n = j1 - c < 8 ? j1 - c : 8;
      for (int i = 0; i < M; ++i) {
        if (n >= 8) {
          _mm256_storeu_ps(y + i * ldy + c, acc[q][h][i]);
        } else if (n > 0) {
          alignas(32) float out[8];
          _mm256_store_ps(out, acc[q][h][i]);
          std::memcpy(y + i * ldy + c, out, static_cast<size_t>(n) * 4);
        }
      }
    }
  }
}

// Outputs [j0, j1) (j0 a multiple of 16) of M x rows: 4 panels at a time for one row, 2 for
// two, 1 for more (8 chains in flight where registers allow).
template <int M>
void PanelRows(const float* x, int64_t ldx, const uint32_t* w, int64_t pairs, int64_t j0,
               int64_t j1, float* y, int64_t ldy) {
  constexpr int64_t kNp = M == 1 ? 4 : M == 2 ? 2 : 1;
  for (int64_t j = j0; j < j1;) {
    const int64_t left = (j1 - j + 15) / 16;
    const int64_t np = left >= kNp ? kNp : left >= 2 ? 2 : 1;
    const uint32_t* wj = w + j / 16 * pairs * 16;
    if (np == 4) PanelBlock<M, (M == 1 ? 4 : 1)>(x, ldx, wj, pairs, j, j1, y, ldy);
    if (np == 2) PanelBlock<M, (M <= 2 ? 2 : 1)>(x, ldx, wj, pairs, j, j1, y, ldy);
    if (np == 1) PanelBlock<M, 1>(x, ldx, wj, pairs, j, j1, y, ldy);
    j += 16 * np;
  }
}

}  // namespace

void Bf16PanelsCompute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t kp = PaddedK(p.w.n_in), pairs = (p.w.n_in + 1) / 2;
  const float* xp = static_cast<const float*>(p.xp);
  if (i1 - i0 >= kTiledMinRows) {
    TiledTask(xp, kp, p.w, i0, i1, j0, j1, p.y, p.ldy);
    return;
  }
  const uint32_t* w = static_cast<const uint32_t*>(p.w.data);
  // x rows in groups of at most kMaxM; each group streams the task's panels once.
  for (int64_t i = i0; i < i1; i += kMaxM) {
    const float* x = xp + i * kp;
    float* y = p.y + i * p.ldy;
    switch (i1 - i < kMaxM ? i1 - i : kMaxM) {
      case 1: PanelRows<1>(x, kp, w, pairs, j0, j1, y, p.ldy); break;
      case 2: PanelRows<2>(x, kp, w, pairs, j0, j1, y, p.ldy); break;
      case 3: PanelRows<3>(x, kp, w, pairs, j0, j1, y, p.ldy); break;
      default: PanelRows<4>(x, kp, w, pairs, j0, j1, y, p.ldy); break;
    }
  }
}

int64_t F32PreparedBytes(int64_t m, int64_t n_in) { return m * PaddedK(n_in) * 4; }
int64_t Bf16PreparedBytes(int64_t m, int64_t n_in) { return m * PaddedK(n_in) * 4; }

// x rows copied into 32-byte aligned rows of PaddedK(n_in) floats, zero-padded (both dtypes).
void F32Prepare(const float* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1, int64_t n_in,
                void* xp, uint8_t* terms) {
  const int64_t kp = PaddedK(n_in);
  for (int64_t i = i0; i < i1; ++i) {
    float* d = static_cast<float*>(xp) + i * kp;
    std::memcpy(d, x + i * ldx, static_cast<size_t>(n_in) * 4);
    std::memset(d + n_in, 0, static_cast<size_t>(kp - n_in) * 4);
    terms[i] = 1;
  }
}
void Bf16Prepare(const float* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1, int64_t n_in,
                 void* xp, uint8_t* terms) {
  F32Prepare(x, ldx, m, i0, i1, n_in, xp, terms);
}

void F32Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  Compute<float>(p, i0, i1, j0, j1);
}
void Bf16Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  Compute<uint16_t>(p, i0, i1, j0, j1);
}

}  // namespace pdserve::kernels::internal::avx2
