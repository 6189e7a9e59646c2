// The avx512 level's kernels (also the amx level's BF16 ones): compiled with -mavx512f/dq/bw/vl
// -mavx512vnni (kernels/CMakeLists.txt; not -mavx512bf16: the level does not require it) and run only where DetectedIsa() allows.
// This file uses nothing but intrinsics and its own functions (no inline code shared with
// baseline files, which the linker could otherwise pick from here; the kernels_isa_objects
// test checks the object file).
//
// F32 / BF16 weights: fp32 FMA on zmm, keeping the one order of every level (kernels/gemm.h):
// each output is the sequential fp32 FMA chain over k, so results are bitwise those of the avx2
// kernels, for any x. Lanes are 16 outputs. Per task, weight rows are packed 32 at a time, kKc k
// at a time, into [k][16 outputs] fp32 panels (16x16 transposes of dwords; bf16 pairs are split
// into their k and k + 1 halves after the transpose), then a microkernel of up to 12 x rows x 2
// panels runs 24 accumulators: per k 2 panel loads, 12 broadcasts of x, 24 FMAs. Partial sums
// between k blocks are parked in y.
// (vdpbf16ps would keep the order too, with k-pairs swapped, for bf16-exact x: it adds the high
// halves' product, then the low halves', rounding after each. But on this CPU it retires 32
// MACs per 2 cycles, half the fp32 FMA rate; AMX's tdpbf16ps sums in an internal order that
// matches no fp32 FMA chain (measured), which would break the one-order contract.)
//
// INT8 (W8A8): vpdpbusd multiplies unsigned by signed bytes, so x is stored as x + 128 (u8) and
// the sum corrected by 128 * sum_k w[j, k]; int32 arithmetic wraps, and the true result fits,
// so the wrapped result is exact. Dot-product layout: lanes hold k (64 per vector), M x rows x
// R weight rows of accumulators, one horizontal sum per output. Bitwise equal to every other
// level (exact integer sums).
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "kernels/avx512_transpose.h"
#include "kernels/isa_kernels.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "gemm_avx512.cc needs -mavx512f -mavx512bw -mavx512vnni"
#endif
#if defined(__AVX512BF16__)
#error "gemm_avx512.cc must not be built with -mavx512bf16: the avx512 level does not require it"
#endif

namespace pdserve::kernels::internal::avx512 {
namespace {

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

// acc + u8(a) . s8(b) per dword. In asm: with the intrinsic, GCC 12 copies each accumulator
// through a scratch register and the stack on every use (24 accumulators: 3x slower).
inline __m512i Dpbusd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// ---- F32 / BF16 weights ------------------------------------------------------------------------

constexpr int64_t kKc = 256;  // k per packed block: 2 panels of 16 outputs x kKc fp32 = 32 KiB, L1
constexpr int kMr = 12;       // x rows per microkernel
inline int64_t F32Stride(int64_t n_in) { return RoundUp(n_in, 8); }  // avx2's prepared rows


// Packs weight rows [0, n_rows) (n_rows <= 16; missing rows zero) x k in [k0, k0 + kc) (k >= n_in
// zero) as fp32 into dst[k][16].
// BF16: per 16 rows x 32 k, the rows' dwords (bf16 pairs) are transposed (64 shuffles), then
// each pair vector gives k (<< 16) and k + 1 (high half masked): 0.19 shuffle-port ops/weight.
void PackPanel(const uint16_t* w, int64_t ld, int64_t n_in, int n_rows, int64_t k0, int64_t kc,
               float* dst) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t s = 0; s < kc; s += 32) {
    const int64_t k = k0 + s, valid = n_in - k;
    const __mmask32 mask = valid >= 32 ? ~__mmask32{0} : (valid <= 0 ? 0 : (__mmask32{1} << valid) - 1);
    __m512i r[16];
    for (int t = 0; t < 16; ++t) {
      r[t] = t < n_rows ? _mm512_maskz_loadu_epi16(mask, w + t * ld + k) : _mm512_setzero_si512();
    }
    Transpose16(r);  // r[p]: pair p (k + 2p, k + 2p + 1) of the 16 rows
    // An odd kc writes one more k (zero: past n_in) at index kc < kKc, never read.
    const int pairs = static_cast<int>(kc - s < 32 ? (kc - s + 1) / 2 : 16);
    for (int p = 0; p < pairs; ++p) {
      _mm512_store_si512(dst + (s + 2 * p) * 16, _mm512_slli_epi32(r[p], 16));
      _mm512_store_si512(dst + (s + 2 * p + 1) * 16, _mm512_and_si512(r[p], hi));
    }
  }
}
// F32: per 16 rows x 16 k, one 16x16 transpose.
void PackPanel(const float* w, int64_t ld, int64_t n_in, int n_rows, int64_t k0, int64_t kc,
               float* dst) {
  for (int64_t s = 0; s < kc; s += 16) {
    const int64_t k = k0 + s, valid = n_in - k;
    const __mmask16 mask = valid >= 16 ? 0xffff : (valid <= 0 ? 0 : static_cast<__mmask16>((1u << valid) - 1));
    __m512i r[16];
    for (int t = 0; t < 16; ++t) {
      r[t] = t < n_rows ? _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, w + t * ld + k))
                        : _mm512_setzero_si512();
    }
    Transpose16(r);
    const int ks = static_cast<int>(kc - s < 16 ? kc - s : 16);
    for (int q = 0; q < ks; ++q) _mm512_store_si512(dst + (s + q) * 16, r[q]);
  }
}

// y[i][c] (+)= chains over kc k for i < M, outputs c < 16 * NP (masked by n_rows): per k, NP
// panel loads, M broadcasts of x, M * NP FMAs. first: start from +0, else from y (the partial
// sums of the previous k blocks, stored exactly).
template <int M, int NP>
void MicroKernel(const float* x, int64_t ldx, const float* panels, int64_t panel_stride,
                 int64_t kc, float* y, int64_t ldy, int n_rows, bool first) {
  const __mmask16 m0 = n_rows >= 16 ? 0xffff : static_cast<__mmask16>((1u << n_rows) - 1);
  const __mmask16 m1 = n_rows >= 32 ? 0xffff : (n_rows <= 16 ? 0 : static_cast<__mmask16>((1u << (n_rows - 16)) - 1));
  __m512 acc[M][NP];
#pragma GCC unroll 12
  for (int i = 0; i < M; ++i) {
    if (first) {
      acc[i][0] = _mm512_setzero_ps();
      if constexpr (NP == 2) acc[i][1] = _mm512_setzero_ps();
    } else {
      acc[i][0] = _mm512_maskz_loadu_ps(m0, y + i * ldy);
      if constexpr (NP == 2) acc[i][1] = _mm512_maskz_loadu_ps(m1, y + i * ldy + 16);
    }
  }
  const float* p1 = panels + panel_stride;
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 w0 = _mm512_load_ps(panels + k * 16);
    __m512 w1 = w0;
    if constexpr (NP == 2) w1 = _mm512_load_ps(p1 + k * 16);
#pragma GCC unroll 12
    for (int i = 0; i < M; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
      acc[i][0] = _mm512_fmadd_ps(xb, w0, acc[i][0]);
      if constexpr (NP == 2) acc[i][1] = _mm512_fmadd_ps(xb, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < M; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, acc[i][0]);
    if constexpr (NP == 2) _mm512_mask_storeu_ps(y + i * ldy + 16, m1, acc[i][1]);
  }
}

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                         int, bool);

template <int NP, int... Ms>
constexpr void FillRow(MicroFn* row, std::integer_sequence<int, Ms...>) {
  ((row[Ms] = &MicroKernel<Ms + 1, NP>), ...);
}
struct MicroTable {
  MicroFn fn[2][kMr];
  constexpr MicroTable() : fn{} {
    FillRow<1>(fn[0], std::make_integer_sequence<int, kMr>{});
    FillRow<2>(fn[1], std::make_integer_sequence<int, kMr>{});
  }
};
constexpr MicroTable kMicro;

struct alignas(64) PanelBuffer {
  float d[2][kKc][16];
};

// Outputs [j0, j1) of x rows [i0, i1): per 32 weight rows and kKc k, `pack` fills 2 fp32 panels
// (pack(j, n_rows, k0, kc, buf)), then microkernels run over the rows in blocks of kMr.
template <typename Pack>
void TilesWith(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1, Pack pack) {
  PanelBuffer& buf = *static_cast<PanelBuffer*>(ThreadScratch(0, sizeof(PanelBuffer)));
  const int64_t n_in = p.w.n_in, ldx = F32Stride(n_in);
  const float* x = static_cast<const float*>(p.xp);
  for (int64_t j = j0; j < j1; j += 32) {
    const int n_rows = static_cast<int>(Min(32, j1 - j));
    const int np = n_rows > 16 ? 2 : 1;
    for (int64_t k0 = 0; k0 < n_in; k0 += kKc) {
      const int64_t kc = Min(kKc, n_in - k0);
      pack(j, n_rows, k0, kc, buf);
      for (int64_t i = i0; i < i1; i += kMr) {
        const int mr = static_cast<int>(Min(kMr, i1 - i));
        kMicro.fn[np - 1][mr - 1](x + i * ldx + k0, ldx, &buf.d[0][0][0], kKc * 16, kc,
                                  p.y + i * p.ldy + j, p.ldy, n_rows, k0 == 0);
      }
    }
  }
}

// Row-major weights: each block's rows are transposed into the panels.
template <typename T>
void Tiles(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const T* w = static_cast<const T*>(p.w.data);
  const int64_t ld = p.w.ld, n_in = p.w.n_in;
  TilesWith(p, i0, i1, j0, j1, [&](int64_t j, int n_rows, int64_t k0, int64_t kc, PanelBuffer& buf) {
    // The next block of the same rows (or the next rows' first block), into L2 while this
    // one runs: 32 rows are more streams than the hardware prefetcher follows.
    const int64_t kn = k0 + kc < n_in ? k0 + kc : 0;
    const int64_t jn = k0 + kc < n_in ? j : j + 32;
    const int64_t bytes = Min(kKc, n_in - kn) * static_cast<int64_t>(sizeof(T));
    for (int t = 0; t < 32 && jn + t < p.w.n_out; ++t) {
      const char* row = reinterpret_cast<const char*>(w + (jn + t) * ld + kn);
      for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
    }
    PackPanel(w + j * ld, ld, n_in, n_rows < 16 ? n_rows : 16, k0, kc, &buf.d[0][0][0]);
    if (n_rows > 16) PackPanel(w + (j + 16) * ld, ld, n_in, n_rows - 16, k0, kc, &buf.d[1][0][0]);
  });
}

// kPanels16 weights: k pairs [k0 / 2, (k0 + kc + 1) / 2) of one packed panel into an fp32
// panel (k = pair << 16, k + 1 = pair's high half): no transposes. An odd kc writes one more k
// (zero: past n_in) at index kc < kKc, never read.
void UnpackPanel(const uint32_t* panel, int64_t k0, int64_t kc, float* dst) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const uint32_t* src = panel + k0 / 2 * 16;
  for (int64_t q = 0; q < (kc + 1) / 2; ++q) {
    const __m512i v = _mm512_load_si512(src + q * 16);
    _mm512_store_si512(dst + 2 * q * 16, _mm512_slli_epi32(v, 16));
    _mm512_store_si512(dst + (2 * q + 1) * 16, _mm512_and_si512(v, hi));
  }
}

// REQUIRES (kernel_table.h and GemmRows): j0 a multiple of 16, so blocks start on panels.
void PanelTiles(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const uint32_t* w = static_cast<const uint32_t*>(p.w.data);
  const int64_t panel_dwords = (p.w.n_in + 1) / 2 * 16;
  TilesWith(p, i0, i1, j0, j1, [&](int64_t j, int n_rows, int64_t k0, int64_t kc, PanelBuffer& buf) {
    UnpackPanel(w + j / 16 * panel_dwords, k0, kc, &buf.d[0][0][0]);
    if (n_rows > 16) UnpackPanel(w + (j / 16 + 1) * panel_dwords, k0, kc, &buf.d[1][0][0]);
  });
}

// How far ahead (in k pairs, one 64-byte line of a panel each) PanelRowsBlock prefetches every
// panel stream. The hardware prefetcher follows the NP streams, but restarts at every 4 KiB
// page and stays close behind: with the lines requested 2 KiB ahead, 40 experts' gate and up
// (m = 1, 2, 12 rows) from DRAM ran 10-18% faster in an in-process A/B (distances 16-96 alike).
constexpr int64_t kPanelPrefetchPairs = 32;

// Decode rows (M = 1-3) against kPanels16 weights, NP panels at a time: every weight is read
// once, in order (NP contiguous streams the hardware prefetcher follows), and turned into fp32
// by a shift (k) or a mask (k + 1); each x row keeps NP independent chains over all of k
// (M * NP = 8 cover the FMA latency: 4 cycles x 2 pipes).
template <int M, int NP>
void PanelRowsBlock(const float* x, int64_t ldx, const uint32_t* w, int64_t pairs, int64_t j,
                    int64_t j1, float* y, int64_t ldy) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  __m512 acc[M][NP];
#pragma GCC unroll 12
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 8
    for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < pairs; ++k) {
    __m512 lo[NP], up[NP];
#pragma GCC unroll 8
    for (int q = 0; q < NP; ++q) {
      // Each panel stream's line kPanelPrefetchPairs ahead; past the panel's end, the same
      // stream of the next block (panel NP + q: the next block of this task, the next task's
      // or nothing; prefetches never fault). Running on into panel q + 1, which this block
      // reads already, left the next block to start on cold lines: short panels (an expert's
      // down projection, 128 pairs) lost a quarter of their lookahead (41 experts x 12 rows,
      // in-process A/B: 5-12% faster at k = 256, neutral at m = 1-2 and k >= 1024).
      const int64_t ahead = k + kPanelPrefetchPairs;
      const int64_t line = ahead < pairs ? q * pairs + ahead : (NP + q) * pairs + (ahead - pairs);
      _mm_prefetch(reinterpret_cast<const char*>(w + line * 16), _MM_HINT_T0);
      const __m512i v = _mm512_load_si512(w + (q * pairs + k) * 16);
      lo[q] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      up[q] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
    }
#pragma GCC unroll 12
    for (int i = 0; i < M; ++i) {
      const __m512 x0 = _mm512_set1_ps(x[i * ldx + 2 * k]);
      const __m512 x1 = _mm512_set1_ps(x[i * ldx + 2 * k + 1]);
#pragma GCC unroll 8
      for (int q = 0; q < NP; ++q) {
        acc[i][q] = _mm512_fmadd_ps(x0, lo[q], acc[i][q]);
        acc[i][q] = _mm512_fmadd_ps(x1, up[q], acc[i][q]);
      }
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < NP; ++q) {
    const int64_t c = j + 16 * q;  // this panel's first output
    const int64_t n = Min(16, j1 - c);
    const __mmask16 mask = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
#pragma GCC unroll 12
    for (int i = 0; i < M; ++i) _mm512_mask_storeu_ps(y + i * ldy + c, mask, acc[i][q]);
  }
}

// Outputs [j0, j1) (j0 a multiple of 16) of M x rows (M <= 12: 2M accumulators, 4 weight
// registers and 2 broadcasts fill 30 of the 32): 8 panels at a time for one row, 4 for two, 2
// for three or more (>= 8 chains in flight); the last panels in halving blocks (a task's slice
// is often only 4-8 panels: one panel at a time would leave one chain per row).
template <int M>
void PanelRows(const float* x, int64_t ldx, const uint32_t* w, int64_t pairs, int64_t j0,
               int64_t j1, float* y, int64_t ldy) {
  constexpr int64_t kNp = M == 1 ? 8 : M == 2 ? 4 : 2;
  for (int64_t j = j0; j < j1;) {
    const int64_t left = (j1 - j + 15) / 16;
    const int64_t np = left >= kNp ? kNp : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    const uint32_t* wj = w + j / 16 * pairs * 16;
    if (np == 8) PanelRowsBlock<M, (M == 1 ? 8 : 1)>(x, ldx, wj, pairs, j, j1, y, ldy);
    if (np == 4) PanelRowsBlock<M, (M <= 2 ? 4 : 1)>(x, ldx, wj, pairs, j, j1, y, ldy);
    if (np == 2) PanelRowsBlock<M, 2>(x, ldx, wj, pairs, j, j1, y, ldy);
    if (np == 1) PanelRowsBlock<M, 1>(x, ldx, wj, pairs, j, j1, y, ldy);
    j += 16 * np;
  }
}

// Decode rows (1-3): 64 weight rows (4 panels) x kKcDecode k per pack, so each x row keeps 4
// independent chains (the FMA latency is 4 cycles); packing costs ~0.19 shuffle-port cycles
// per weight against 0.375 for avx2's in-register 8x8 transposes.
constexpr int64_t kKcDecode = 128;  // 4 panels x 128 k x 16 fp32 = 32 KiB

template <int M>
void DecodeKernel(const float* x, int64_t ldx, const float* panels, int64_t kc, float* y,
                  int64_t ldy, int n_rows, bool first) {
  __mmask16 mask[4];
  for (int q = 0; q < 4; ++q) {
    const int n = n_rows - 16 * q;
    mask[q] = n >= 16 ? 0xffff : (n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1));
  }
  __m512 acc[M][4];
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      acc[i][q] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[q], y + i * ldy + 16 * q);
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    __m512 w[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) w[q] = _mm512_load_ps(panels + (q * kKcDecode + k) * 16);
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) acc[i][q] = _mm512_fmadd_ps(xb, w[q], acc[i][q]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i) {
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) _mm512_mask_storeu_ps(y + i * ldy + 16 * q, mask[q], acc[i][q]);
  }
}

struct alignas(64) DecodeBuffer {
  float d[4][kKcDecode][16];
};

template <typename T>
void DecodeTiles(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  DecodeBuffer& buf = *static_cast<DecodeBuffer*>(ThreadScratch(1, sizeof(DecodeBuffer)));
  const T* w = static_cast<const T*>(p.w.data);
  const int64_t ld = p.w.ld, n_in = p.w.n_in, ldx = F32Stride(n_in);
  const float* x = static_cast<const float*>(p.xp);
  const int m = static_cast<int>(i1 - i0);
  for (int64_t j = j0; j < j1; j += 64) {
    const int n_rows = static_cast<int>(Min(64, j1 - j));
    for (int64_t k0 = 0; k0 < n_in; k0 += kKcDecode) {
      const int64_t kc = Min(kKcDecode, n_in - k0);
      // Prefetch the block after the next one into L2 (same rows further on, or the next
      // rows' start): one line per row per 64 bytes of it.
      const int64_t kn = k0 + kc < n_in ? k0 + kc : 0;
      const int64_t jn = k0 + kc < n_in ? j : j + 64;
      const int64_t bytes = Min(kKcDecode, n_in - kn) * static_cast<int64_t>(sizeof(T));
      for (int t = 0; t < 64 && jn + t < p.w.n_out; ++t) {
        const char* row = reinterpret_cast<const char*>(w + (jn + t) * ld + kn);
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
      }
      for (int q = 0; q < 4; ++q) {
        const int nq = n_rows - 16 * q;
        if (nq > 0) {
          PackPanel(w + (j + 16 * q) * ld, ld, n_in, nq < 16 ? nq : 16, k0, kc, &buf.d[q][0][0]);
        } else {
          for (int64_t k = 0; k < kc; ++k) _mm512_store_ps(&buf.d[q][k][0], _mm512_setzero_ps());
        }
      }
      const float* xk = x + i0 * ldx + k0;
      float* yk = p.y + i0 * p.ldy + j;
      switch (m) {
        case 1: DecodeKernel<1>(xk, ldx, &buf.d[0][0][0], kc, yk, p.ldy, n_rows, k0 == 0); break;
        case 2: DecodeKernel<2>(xk, ldx, &buf.d[0][0][0], kc, yk, p.ldy, n_rows, k0 == 0); break;
        default: DecodeKernel<3>(xk, ldx, &buf.d[0][0][0], kc, yk, p.ldy, n_rows, k0 == 0); break;
      }
    }
  }
}

// ---- INT8 -------------------------------------------------------------------------------------

inline int64_t Int8Stride(int64_t n_in) { return RoundUp(n_in, 64); }

// acc[i][r] = sum_k xu[i][k] * w[r][k] for i < M, r < R (xu = x + 128), and with kSums
// wsum[r] = sum_k w[r][k] (computed once per weight block, by its first group of x rows).
template <int M, int R, bool kSums>
void Int8Block(const uint8_t* x, int64_t ldx, const int8_t* w, int64_t ld, int64_t n_in,
               int32_t acc_out[4][8], int32_t wsum_out[8], const char* pf, const char* pf_end) {
  __m512i acc[M][R], ws[R];
  const __m512i ones = _mm512_set1_epi8(1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    ws[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) acc[i][r] = _mm512_setzero_si512();
  }
  const int64_t steps = (n_in + 63) / 64;
  const int64_t lines = (pf_end - pf + 63) / 64;
  const int64_t lines_per_step = (lines + steps - 1) / steps;
  for (int64_t k = 0; k < n_in; k += 64) {
    for (int64_t l = 0; l < lines_per_step && pf < pf_end; ++l, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
    const int64_t valid = n_in - k;
    const __mmask64 mask = valid >= 64 ? ~__mmask64{0} : (__mmask64{1} << valid) - 1;
    __m512i xv[M];
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) xv[i] = _mm512_load_si512(x + i * ldx + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i wv = _mm512_maskz_loadu_epi8(mask, w + r * ld + k);
      if constexpr (kSums) ws[r] = Dpbusd(ws[r], ones, wv);
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[i][r] = Dpbusd(acc[i][r], xv[i], wv);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    if constexpr (kSums) wsum_out[r] = _mm512_reduce_add_epi32(ws[r]);
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) acc_out[i][r] = _mm512_reduce_add_epi32(acc[i][r]);
  }
}

using Int8BlockFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, int64_t,
                             int32_t[4][8], int32_t[8], const char*, const char*);

template <int M, bool kSums, int... Rs>
constexpr void FillInt8Row(Int8BlockFn* row, std::integer_sequence<int, Rs...>) {
  ((row[Rs] = &Int8Block<M, Rs + 1, kSums>), ...);
}
struct Int8Table {
  Int8BlockFn fn[2][4][8];  // [with sums][M - 1][R - 1]
  constexpr Int8Table() : fn{} {
    FillInt8Row<1, false>(fn[0][0], std::make_integer_sequence<int, 8>{});
    FillInt8Row<2, false>(fn[0][1], std::make_integer_sequence<int, 8>{});
    FillInt8Row<3, false>(fn[0][2], std::make_integer_sequence<int, 8>{});
    FillInt8Row<4, false>(fn[0][3], std::make_integer_sequence<int, 8>{});
    FillInt8Row<1, true>(fn[1][0], std::make_integer_sequence<int, 8>{});
    FillInt8Row<2, true>(fn[1][1], std::make_integer_sequence<int, 8>{});
    FillInt8Row<3, true>(fn[1][2], std::make_integer_sequence<int, 8>{});
    FillInt8Row<4, true>(fn[1][3], std::make_integer_sequence<int, 8>{});
  }
};
constexpr Int8Table kInt8;

// Outer-product layout for tasks of >= kInt8TilesMinRows rows: 32 weight rows x kInt8Kc k are
// packed as [k quad][16 outputs] dwords (16x16 dword transposes), and their sums over k as one
// vector per panel; a microkernel of up to 12 x rows x 2 panels runs 24 int32 accumulators:
// per quad 2 panel loads, 12 broadcasts of x quads, 24 vpdpbusd. Partial sums between k blocks
// are parked in y (int32 bits in the fp32 slots when dequantizing); the last block applies the
// correction and the epilogue.
constexpr int64_t kInt8Kc = 1024;  // 2 panels of 256 quads x 16 dwords = 32 KiB, in L1
constexpr int64_t kInt8TilesMinRows = 4;

struct alignas(64) Int8PanelBuffer {
  uint32_t d[2][kInt8Kc / 4][16];
};

// Packs weight rows [0, n_rows) (<= 16; missing rows zero) x k in [k0, k0 + kc) (k >= n_in zero)
// into dst[quad][16]; adds each row's sum of weights over these k to *wsum (lane = row).
void PackInt8Panel(const int8_t* w, int64_t ld, int64_t n_in, int n_rows, int64_t k0, int64_t kc,
                   uint32_t* dst, __m512i* wsum) {
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t s = 0; s < kc; s += 64) {
    const int64_t k = k0 + s, valid = n_in - k;
    const __mmask64 mask = valid >= 64 ? ~__mmask64{0} : (valid <= 0 ? 0 : (__mmask64{1} << valid) - 1);
    __m512i r[16];
    for (int t = 0; t < 16; ++t) {
      r[t] = t < n_rows ? _mm512_maskz_loadu_epi8(mask, w + t * ld + k) : _mm512_setzero_si512();
    }
    Transpose16(r);  // r[q]: quad q (k + 4q .. k + 4q + 3) of the 16 rows
    const int quads = static_cast<int>(kc - s < 64 ? (kc - s + 3) / 4 : 16);
    for (int q = 0; q < quads; ++q) {
      _mm512_store_si512(dst + (s / 4 + q) * 16, r[q]);
      *wsum = Dpbusd(*wsum, ones, r[q]);
    }
  }
}

template <int M, int NP>
void Int8MicroKernel(const uint8_t* x, int64_t ldx, const uint32_t* panels, int64_t panel_stride,
                     int64_t quads, const Int8Problem& p, int64_t i, int64_t j, int n_rows,
                     bool first, bool last, const __m512i* wsum) {
  const __mmask16 m0 = n_rows >= 16 ? 0xffff : static_cast<__mmask16>((1u << n_rows) - 1);
  const __mmask16 m1 = n_rows >= 32 ? 0xffff : (n_rows <= 16 ? 0 : static_cast<__mmask16>((1u << (n_rows - 16)) - 1));
  int32_t* yi = static_cast<int32_t*>(p.y);  // int32 view of the output slots
  __m512i acc[M][NP];
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    if (first) {
      acc[r][0] = _mm512_setzero_si512();
      if constexpr (NP == 2) acc[r][1] = _mm512_setzero_si512();
    } else {
      acc[r][0] = _mm512_maskz_loadu_epi32(m0, yi + (i + r) * p.ldy + j);
      if constexpr (NP == 2) acc[r][1] = _mm512_maskz_loadu_epi32(m1, yi + (i + r) * p.ldy + j + 16);
    }
  }
  const uint32_t* p1 = panels + panel_stride;
  for (int64_t q = 0; q < quads; ++q) {
    const __m512i w0 = _mm512_load_si512(panels + q * 16);
    __m512i w1 = w0;
    if constexpr (NP == 2) w1 = _mm512_load_si512(p1 + q * 16);
#pragma GCC unroll 12
    for (int r = 0; r < M; ++r) {
      int32_t quad;
      std::memcpy(&quad, x + r * ldx + 4 * q, 4);
      const __m512i xb = _mm512_set1_epi32(quad);
      acc[r][0] = Dpbusd(acc[r][0], xb, w0);
      if constexpr (NP == 2) acc[r][1] = Dpbusd(acc[r][1], xb, w1);
    }
  }
  if (!last) {
#pragma GCC unroll 12
    for (int r = 0; r < M; ++r) {
      _mm512_mask_storeu_epi32(yi + (i + r) * p.ldy + j, m0, acc[r][0]);
      if constexpr (NP == 2) _mm512_mask_storeu_epi32(yi + (i + r) * p.ldy + j + 16, m1, acc[r][1]);
    }
    return;
  }
  const __m512i c0 = _mm512_slli_epi32(wsum[0], 7);
  const __m512i c1 = _mm512_slli_epi32(wsum[1], 7);
  __m512 ws0 = _mm512_setzero_ps(), ws1 = ws0;
  if (!p.raw) {
    ws0 = _mm512_maskz_loadu_ps(m0, p.w.scales + j);
    if constexpr (NP == 2) ws1 = _mm512_maskz_loadu_ps(m1, p.w.scales + j + 16);
  }
#pragma GCC unroll 12
  for (int r = 0; r < M; ++r) {
    const __m512i v0 = _mm512_sub_epi32(acc[r][0], c0);  // wraps: exact
    __m512i v1 = v0;
    if constexpr (NP == 2) v1 = _mm512_sub_epi32(acc[r][1], c1);
    if (p.raw) {
      _mm512_mask_storeu_epi32(yi + (i + r) * p.ldy + j, m0, v0);
      if constexpr (NP == 2) _mm512_mask_storeu_epi32(yi + (i + r) * p.ldy + j + 16, m1, v1);
    } else {
      float* yf = static_cast<float*>(p.y) + (i + r) * p.ldy + j;
      const __m512 xs = _mm512_set1_ps(p.x_scales[i + r]);
      _mm512_mask_storeu_ps(yf, m0, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v0), xs), ws0));
      if constexpr (NP == 2) {
        _mm512_mask_storeu_ps(yf + 16, m1, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v1), xs), ws1));
      }
    }
  }
}

using Int8MicroFn = void (*)(const uint8_t*, int64_t, const uint32_t*, int64_t, int64_t,
                             const Int8Problem&, int64_t, int64_t, int, bool, bool, const __m512i*);
template <int NP, int... Ms>
constexpr void FillInt8MicroRow(Int8MicroFn* row, std::integer_sequence<int, Ms...>) {
  ((row[Ms] = &Int8MicroKernel<Ms + 1, NP>), ...);
}
struct Int8MicroTable {
  Int8MicroFn fn[2][kMr];
  constexpr Int8MicroTable() : fn{} {
    FillInt8MicroRow<1>(fn[0], std::make_integer_sequence<int, kMr>{});
    FillInt8MicroRow<2>(fn[1], std::make_integer_sequence<int, kMr>{});
  }
};
constexpr Int8MicroTable kInt8Micro;

void Int8Tiles(const Int8Problem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  Int8PanelBuffer& buf = *static_cast<Int8PanelBuffer*>(ThreadScratch(2, sizeof(Int8PanelBuffer)));
  const Int8WeightView& w = p.w;
  const int64_t n_in = w.n_in, ldx = RoundUp(n_in, 64);
  const uint8_t* x = static_cast<const uint8_t*>(p.xp);
  for (int64_t j = j0; j < j1; j += 32) {
    const int n_rows = static_cast<int>(Min(32, j1 - j));
    const int np = n_rows > 16 ? 2 : 1;
    __m512i wsum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int64_t k0 = 0; k0 < n_in; k0 += kInt8Kc) {
      const int64_t kc = Min(kInt8Kc, n_in - k0);
      const int64_t kn = k0 + kc < n_in ? k0 + kc : 0;
      const int64_t jn = k0 + kc < n_in ? j : j + 32;
      const int64_t bytes = Min(kInt8Kc, n_in - kn);
      for (int t = 0; t < 32 && jn + t < w.n_out; ++t) {
        const char* row = reinterpret_cast<const char*>(w.data + (jn + t) * w.ld + kn);
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
      }
      PackInt8Panel(w.data + j * w.ld, w.ld, n_in, n_rows < 16 ? n_rows : 16, k0, kc, &buf.d[0][0][0], &wsum[0]);
      if (np == 2) PackInt8Panel(w.data + (j + 16) * w.ld, w.ld, n_in, n_rows - 16, k0, kc, &buf.d[1][0][0], &wsum[1]);
      const bool last = k0 + kc >= n_in;
      for (int64_t i = i0; i < i1; i += kMr) {
        const int mr = static_cast<int>(Min(kMr, i1 - i));
        kInt8Micro.fn[np - 1][mr - 1](x + i * ldx + k0, ldx, &buf.d[0][0][0], kInt8Kc / 4 * 16,
                                      (kc + 3) / 4, p, i, j, n_rows, k0 == 0, last, wsum);
      }
    }
  }
}

}  // namespace

// Tasks of fewer than kTilesMinRows rows: the 4-panel decode kernel for rows of >= 1024 k, else
// avx2's in-register streaming kernel (short rows: per-block packing and prefetch overheads
// dominated, bench_isa GEMV 3072x384 and 1024x256). All give the same bits.
constexpr int64_t kTilesMinRows = 4;
constexpr int64_t kDecodeTilesMinK = 1024;

void F32Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (i1 - i0 < kTilesMinRows && p.w.n_in < kDecodeTilesMinK) {
    avx2::F32Compute(p, i0, i1, j0, j1);
  } else if (i1 - i0 < kTilesMinRows) {
    DecodeTiles<float>(p, i0, i1, j0, j1);
  } else {
    Tiles<float>(p, i0, i1, j0, j1);
  }
}
void Bf16Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (i1 - i0 < kTilesMinRows && p.w.n_in < kDecodeTilesMinK) {
    avx2::Bf16Compute(p, i0, i1, j0, j1);
  } else if (i1 - i0 < kTilesMinRows) {
    DecodeTiles<uint16_t>(p, i0, i1, j0, j1);
  } else {
    Tiles<uint16_t>(p, i0, i1, j0, j1);
  }
}

// kPanels16 tasks of up to this many rows read the packed panels directly (PanelRows, groups of
// at most kPanelRowsGroup rows, each group streaming the task's panels once): the bf16 pairs
// turn into fp32 in registers, 4 ALU operations per 2 panels x 2 k against 4M FMAs. Above it
// the tiles' unpack into an fp32 L1 buffer pays for itself. Single-thread, L2-resident 256 x
// 1024 (an expert's gate): m = 8 went from 101 to 159 GFLOP/s, m = 16 from 125 to 164, m = 24
// from 144 to 161, m = 32 the same either way (Xeon, AVX-512). Same chains, so the same bits.
//
// Groups are full (12 rows) first, the remainder last: the first group is the one that waits on
// memory for the weights (the later ones find them in L2), and 12 rows give it the most FMAs to
// hide that behind. 41 experts x m rows from DRAM, two threads, in-process A/B against near-equal
// groups of at most 11: m = 12 (one group, not 6 + 6) 20-28% faster, m = 14 / 16 / 20 / 24
// 7-11%, the down shape (k = 256) at m = 16 11%.
constexpr int64_t kPanelRowsMaxRows = 24;
constexpr int64_t kPanelRowsGroup = 12;

void Bf16PanelsCompute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (i1 - i0 > kPanelRowsMaxRows) {
    PanelTiles(p, i0, i1, j0, j1);
    return;
  }
  const int64_t ldx = F32Stride(p.w.n_in), pairs = (p.w.n_in + 1) / 2;
  const uint32_t* w = static_cast<const uint32_t*>(p.w.data);
  for (int64_t i = i0; i < i1; i += kPanelRowsGroup) {
    const float* x = static_cast<const float*>(p.xp) + i * ldx;
    float* y = p.y + i * p.ldy;
    switch (Min(kPanelRowsGroup, i1 - i)) {
      case 1: PanelRows<1>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 2: PanelRows<2>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 3: PanelRows<3>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 4: PanelRows<4>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 5: PanelRows<5>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 6: PanelRows<6>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 7: PanelRows<7>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 8: PanelRows<8>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 9: PanelRows<9>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 10: PanelRows<10>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      case 11: PanelRows<11>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
      default: PanelRows<kPanelRowsGroup>(x, ldx, w, pairs, j0, j1, y, p.ldy); break;
    }
  }
}

int64_t Int8PreparedBytes(int64_t m, int64_t n_in) { return RoundUp(m * Int8Stride(n_in), 64); }

// x + 128 as u8, rows of Int8Stride(n_in) bytes, padded with 128 (= x 0).
void Int8Prepare(const int8_t* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1, int64_t n_in,
                 void* xp, uint8_t* terms) {
  const int64_t ld = Int8Stride(n_in);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = i0; i < i1; ++i) {
    uint8_t* d = static_cast<uint8_t*>(xp) + i * ld;
    for (int64_t k = 0; k < ld; k += 64) {
      const int64_t valid = n_in - k;
      const __mmask64 mask = valid >= 64 ? ~__mmask64{0} : (valid <= 0 ? 0 : (__mmask64{1} << valid) - 1);
      _mm512_store_si512(d + k, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, x + i * ldx + k), bias));
    }
  }
}

void Int8Compute(const Int8Problem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (i1 - i0 >= kInt8TilesMinRows) {
    Int8Tiles(p, i0, i1, j0, j1);
    return;
  }
  const Int8WeightView& w = p.w;
  const uint8_t* xu = static_cast<const uint8_t*>(p.xp);
  const int64_t ldx = Int8Stride(w.n_in);
  // m = 1: 8 weight rows per block; otherwise groups of <= 4 x rows x 6 weight rows (24 zmm).
  const int rows = i1 - i0 == 1 ? 8 : 6;
  int32_t acc[4][8], wsum[8];
  for (int64_t j = j0; j < j1; j += rows) {
    const int r = static_cast<int>(Min(rows, j1 - j));
    const int64_t jn = j + r, rn = Min(rows, j1 - jn);
    const char* pf = reinterpret_cast<const char*>(w.data + jn * w.ld);
    const char* pf_end = rn > 0 ? reinterpret_cast<const char*>(w.data + (jn + rn - 1) * w.ld + w.n_in) : pf;
    for (int64_t i = i0; i < i1; i += 4) {
      const int mg = static_cast<int>(Min(4, i1 - i));
      kInt8.fn[i == i0 ? 1 : 0][mg - 1][r - 1](xu + i * ldx, ldx, w.data + j * w.ld, w.ld, w.n_in, acc, wsum, pf,
                              i == i0 ? pf_end : pf);
      for (int ii = 0; ii < mg; ++ii) {
        for (int rr = 0; rr < r; ++rr) {
          // Exact: wrap-around int32 arithmetic, true value in range.
          const int32_t v = static_cast<int32_t>(static_cast<uint32_t>(acc[ii][rr]) -
                                                 (static_cast<uint32_t>(wsum[rr]) << 7));
          if (p.raw) {
            static_cast<int32_t*>(p.y)[(i + ii) * p.ldy + j + rr] = v;
          } else {
            static_cast<float*>(p.y)[(i + ii) * p.ldy + j + rr] =
                (static_cast<float>(v) * p.x_scales[i + ii]) * w.scales[j + rr];
          }
        }
      }
    }
  }
}

}  // namespace pdserve::kernels::internal::avx512
