// The avx512 level's kernels (also the amx level's BF16 ones): compiled with -mavx512f/dq/bw/vl
// -mavx512vnni -mavx512bf16 (kernels/CMakeLists.txt) and run only where DetectedIsa() allows.
// This file uses nothing but intrinsics and its own functions (no inline code shared with
// baseline files, which the linker could otherwise pick from here; the kernels_isa_objects
// test checks the object file).
//
// BF16 weights: vdpbf16ps, keeping the one order of every level (kernels/gemm.h): each output is
// the sequential fp32 chain over k. vdpbf16ps adds, per 32-bit lane, the product of the high
// bf16 halves and then that of the low halves, rounding after each (measured bit for bit
// against that model on this CPU; the SDM pseudocode says the same). With each (k, k+1) pair
// stored swapped (k in the high half), a lane does fma(x_k, w_k) then fma(x_k+1, w_k+1): the
// FMA chain, whenever x_k is bf16-exact (the product of two bf16 is exact in fp32). Every
// projection input of the model is bf16-exact; rows that are not go through the avx2 kernels,
// which give the same bits. (vdpbf16ps treats bf16 denormals as zero and flushes denormal
// sums: only values below 2^-126 differ.)
//   Layout: lanes are 16 outputs. Per task, weight rows are packed 32 at a time, kKc k at a time,
//   into [k pair][16 outputs] panels (a 16x16 transpose of dwords per 16 rows x 32 k), then a
//   microkernel of up to 12 x rows x 2 panels runs 24 accumulators: per k pair 2 panel loads,
//   12 broadcasts of x pairs, 24 vdpbf16ps. Partial sums between k blocks are parked in y.
//
// INT8 (W8A8): vpdpbusd multiplies unsigned by signed bytes, so x is stored as x + 128 (u8) and
// the sum corrected by 128 * sum_k w[j, k]; int32 arithmetic wraps, and the true result fits,
// so the wrapped result is exact. Dot-product layout: lanes hold k (64 per vector), M x rows x
// R weight rows of accumulators, one horizontal sum per output. Bitwise equal to every other
// level (exact integer sums).
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "kernels/isa_kernels.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__) || \
    !defined(__AVX512BF16__)
#error "gemm_avx512.cc needs -mavx512f -mavx512bw -mavx512vnni -mavx512bf16"
#endif

namespace pdserve::kernels::internal::avx512 {
namespace {

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- BF16 -------------------------------------------------------------------------------------

constexpr int64_t kKc = 512;   // k per packed block (multiple of 32): 2 panels = 32 KiB, in L1
constexpr int kMr = 12;        // x rows per microkernel
// The avx2 level's fp32 copy of x (rows of RoundUp(n_in, 8) floats) comes first in the
// prepared buffer, then the swapped bf16 pairs (rows of RoundUp(n_in, 32) / 2 dwords).
inline int64_t F32Stride(int64_t n_in) { return RoundUp(n_in, 8); }
inline int64_t PairStride(int64_t n_in) { return RoundUp(n_in, 32) / 2; }
inline int64_t PairsOffset(int64_t m, int64_t n_in) { return RoundUp(m * F32Stride(n_in) * 4, 64); }

// 16x16 transpose of dwords: r[row][col] -> r[col][row].
inline void Transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // b[4q + c], 128-bit lane L: rows 4q..4q+3 of column 4L + c.
  for (int c = 0; c < 4; ++c) {
    const __m512i s0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44);
    const __m512i s1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
    const __m512i s2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
    const __m512i s3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
  }
}

// Packs weight rows [j, j + n_rows) (n_rows <= 16; missing rows zero) x k in [k0, k0 + kc)
// (kc a multiple of 32; k >= n_in zero) into dst[pair][16]: dword = (w[k] << 16) | w[k + 1].
void PackPanel(const uint16_t* w, int64_t ld, int64_t n_in, int n_rows, int64_t k0, int64_t kc,
               uint32_t* dst) {
  for (int64_t s = 0; s < kc; s += 32) {
    const int64_t k = k0 + s;
    const int64_t valid = n_in - k;
    const __mmask32 mask = valid >= 32 ? ~__mmask32{0} : (valid <= 0 ? 0 : (__mmask32{1} << valid) - 1);
    __m512i r[16];
    for (int t = 0; t < 16; ++t) {
      r[t] = t < n_rows ? _mm512_rol_epi32(_mm512_maskz_loadu_epi16(mask, w + t * ld + k), 16)
                        : _mm512_setzero_si512();
    }
    Transpose16(r);
    for (int p = 0; p < 16; ++p) _mm512_store_si512(dst + (s / 2 + p) * 16, r[p]);
  }
}

// y[i][c] (+)= chains over kp pairs for i < M, outputs c < 16 * NP (masked by n_rows).
template <int M, int NP>
void MicroKernel(const uint32_t* x, int64_t ldp, const uint32_t* panels, int64_t panel_stride,
                 int64_t kp, float* y, int64_t ldy, int n_rows, bool first) {
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
  const uint32_t* p1 = panels + panel_stride;
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_load_si512(panels + p * 16);
    __m512bh w1 = w0;
    if constexpr (NP == 2) w1 = (__m512bh)_mm512_load_si512(p1 + p * 16);
#pragma GCC unroll 12
    for (int i = 0; i < M; ++i) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[i * ldp + p]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xb, w0);
      if constexpr (NP == 2) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xb, w1);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < M; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, acc[i][0]);
    if constexpr (NP == 2) _mm512_mask_storeu_ps(y + i * ldy + 16, m1, acc[i][1]);
  }
}

using MicroFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, float*,
                         int64_t, int, bool);

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
  uint32_t d[2][kKc / 2][16];
};

void Bf16Tiles(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  static thread_local PanelBuffer buf;
  const uint16_t* w = static_cast<const uint16_t*>(p.w.data);
  const int64_t ld = p.w.ld, n_in = p.w.n_in, kp_all = RoundUp(n_in, 32);
  const int64_t ldp = PairStride(n_in);
  const uint32_t* xpairs = reinterpret_cast<const uint32_t*>(static_cast<const char*>(p.xp) +
                                                             PairsOffset(p.m, n_in));
  for (int64_t j = j0; j < j1; j += 32) {
    const int n_rows = static_cast<int>(Min(32, j1 - j));
    const int np = n_rows > 16 ? 2 : 1;
    for (int64_t k0 = 0; k0 < kp_all; k0 += kKc) {
      const int64_t kc = Min(kKc, kp_all - k0);
      // The next block of the same rows (or the next rows' first block) while this one runs:
      // 32 rows of kKc bf16, one prefetch per line, into L2.
      const int64_t kn = k0 + kc < kp_all ? k0 + kc : 0;
      const int64_t jn = k0 + kc < kp_all ? j : j + 32;
      for (int t = 0; t < 32 && jn + t < p.w.n_out; ++t) {
        const char* row = reinterpret_cast<const char*>(w + (jn + t) * ld + kn);
        const int64_t bytes = Min(kKc, n_in - kn) * 2;
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
      }
      PackPanel(w + j * ld, ld, n_in, n_rows < 16 ? n_rows : 16, k0, kc, &buf.d[0][0][0]);
      if (np == 2) PackPanel(w + (j + 16) * ld, ld, n_in, n_rows - 16, k0, kc, &buf.d[1][0][0]);
      for (int64_t i = i0; i < i1; i += kMr) {
        const int mr = static_cast<int>(Min(kMr, i1 - i));
        kMicro.fn[np - 1][mr - 1](xpairs + i * ldp + k0 / 2, ldp, &buf.d[0][0][0], kKc / 2 * 16,
                                  kc / 2, p.y + i * p.ldy + j, p.ldy, n_rows, k0 == 0);
      }
    }
  }
}

// ---- INT8 -------------------------------------------------------------------------------------

inline int64_t Int8Stride(int64_t n_in) { return RoundUp(n_in, 64); }

// acc[i][r] = sum_k xu[i][k] * w[r][k] for i < M, r < R (xu = x + 128), and wsum[r] = sum_k w[r][k].
template <int M, int R>
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
      ws[r] = _mm512_dpbusd_epi32(ws[r], ones, wv);
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[i][r] = _mm512_dpbusd_epi32(acc[i][r], xv[i], wv);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    wsum_out[r] = _mm512_reduce_add_epi32(ws[r]);
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) acc_out[i][r] = _mm512_reduce_add_epi32(acc[i][r]);
  }
}

using Int8BlockFn = void (*)(const uint8_t*, int64_t, const int8_t*, int64_t, int64_t,
                             int32_t[4][8], int32_t[8], const char*, const char*);

template <int M, int... Rs>
constexpr void FillInt8Row(Int8BlockFn* row, std::integer_sequence<int, Rs...>) {
  ((row[Rs] = &Int8Block<M, Rs + 1>), ...);
}
struct Int8Table {
  Int8BlockFn fn[4][8];
  constexpr Int8Table() : fn{} {
    FillInt8Row<1>(fn[0], std::make_integer_sequence<int, 8>{});
    FillInt8Row<2>(fn[1], std::make_integer_sequence<int, 8>{});
    FillInt8Row<3>(fn[2], std::make_integer_sequence<int, 8>{});
    FillInt8Row<4>(fn[3], std::make_integer_sequence<int, 8>{});
  }
};
constexpr Int8Table kInt8;

}  // namespace

int64_t Bf16PreparedBytes(int64_t m, int64_t n_in) {
  return PairsOffset(m, n_in) + RoundUp(m * PairStride(n_in) * 4, 64);
}

// The fp32 rows (for rows that need the avx2 kernels) and the swapped bf16 pairs; terms[i] is
// 1 when row i is bf16-exact, else 3.
void Bf16Prepare(const float* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1, int64_t n_in,
                 void* xp, uint8_t* terms) {
  avx2::Bf16Prepare(x, ldx, m, i0, i1, n_in, xp, terms);
  uint32_t* pairs = reinterpret_cast<uint32_t*>(static_cast<char*>(xp) + PairsOffset(m, n_in));
  const int64_t ldp = PairStride(n_in);
  // Words 1, 3, .., 63 of two fp32 vectors: the high (bf16) halves of 32 floats, in order.
  alignas(64) static const uint16_t kOdd[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i odd = _mm512_load_si512(kOdd);
  for (int64_t i = i0; i < i1; ++i) {
    const float* s = x + i * ldx;
    __m512i low_bits = _mm512_setzero_si512();
    for (int64_t k = 0; k < 2 * ldp; k += 32) {
      const int64_t valid = n_in - k;
      const __mmask16 m0 = valid >= 16 ? 0xffff : (valid <= 0 ? 0 : static_cast<__mmask16>((1u << valid) - 1));
      const __mmask16 m1 = valid >= 32 ? 0xffff : (valid <= 16 ? 0 : static_cast<__mmask16>((1u << (valid - 16)) - 1));
      const __m512i v0 = _mm512_castps_si512(_mm512_maskz_loadu_ps(m0, s + k));
      const __m512i v1 = _mm512_castps_si512(_mm512_maskz_loadu_ps(m1, s + k + 16));
      low_bits = _mm512_or_si512(low_bits, _mm512_or_si512(v0, v1));
      const __m512i bf = _mm512_permutex2var_epi16(v0, odd, v1);
      _mm512_store_si512(pairs + i * ldp + k / 2, _mm512_rol_epi32(bf, 16));
    }
    const bool exact = _mm512_test_epi32_mask(low_bits, _mm512_set1_epi32(0xffff)) == 0;
    terms[i] = exact ? 1 : 3;
  }
}

void Bf16Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  for (int64_t i = i0; i < i1; ++i) {
    if (p.terms[i] != 1) {  // a row that is not bf16-exact: the avx2 kernels (the same bits)
      avx2::Bf16Compute(p, i0, i1, j0, j1);
      return;
    }
  }
  Bf16Tiles(p, i0, i1, j0, j1);
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
      kInt8.fn[mg - 1][r - 1](xu + i * ldx, ldx, w.data + j * w.ld, w.ld, w.n_in, acc, wsum, pf,
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
