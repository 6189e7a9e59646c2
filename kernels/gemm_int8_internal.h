// Internals of kernels/gemm_int8.h shared by gemm_int8.cc (API, planning, decode path),
// gemm_int8_tiled.cc (prefill path), the test and bench/w8a8. Not part of the model API.
#pragma once

#include <cstdint>

#include "kernels/gemm_int8.h"

namespace pdserve::kernels::internal {

// One GEMM as the paths see it: x already widened to int16 (rows of ldx16 >= n_in elements,
// zero past n_in up to the next even k), output either the dequantized fp32 y or raw int32.
struct Int8Problem {
  const int16_t* x16 = nullptr;
  int64_t ldx16 = 0;
  const float* x_scales = nullptr;  // unused when raw
  int64_t m = 0;
  Int8WeightView w;
  void* y = nullptr;  // float* (dequantized) or int32_t* (raw)
  int64_t ldy = 0;
  bool raw = false;
};

// Row stride of the widened x for n_in: even (k-pairs) and a multiple of 16 elements (32 B).
inline int64_t WidenedStride(int64_t n_in) { return (n_in + 15) / 16 * 16; }

// x16[i * ldx16 + k] = x[i * ldx + k] for k < n, 0 for n <= k < ldx16.
void WidenRows(const int8_t* x, int64_t m, int64_t n, int64_t ldx, int16_t* x16, int64_t ldx16);

// Both paths compute outputs j in [j_begin, j_end) for rows [i_begin, i_end) of p on the
// calling thread. REQUIRES: non-empty ranges, p.w.n_in >= 1.
// Weight-streaming path (meant for small m; any m works).
void GemmInt8SmallM(const Int8Problem& p, int64_t i_begin, int64_t i_end, int64_t j_begin,
                    int64_t j_end);
// Packed-panel tiled path (meant for large m; any m works).
void GemmInt8Tiled(const Int8Problem& p, int64_t i_begin, int64_t i_end, int64_t j_begin,
                   int64_t j_end);

// Task grid of the tiled path for an (m, n) output on n_threads (same policy as the F32 GEMM:
// at least two tasks per thread when the shape allows): task sizes mc x nc.
void TiledTaskGrid(int64_t m, int64_t n, int n_threads, int64_t* mc, int64_t* nc);

}  // namespace pdserve::kernels::internal
