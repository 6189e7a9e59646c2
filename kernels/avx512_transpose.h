// A 16x16 transpose of 32-bit words in AVX-512 registers, shared by the AVX-512 and AMX GEMM
// packing code. Include it only from translation units compiled with AVX-512 enabled
// (kernels/CMakeLists.txt: gemm_avx512.cc, gemm_amx.cc).
#pragma once

#include <immintrin.h>

namespace pdserve::kernels {

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

}  // namespace pdserve::kernels
