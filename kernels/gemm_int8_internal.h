// Internals of kernels/gemm_int8.h: the avx2 level's two paths (gemm_int8_avx2.cc,
// gemm_int8_avx2_tiled.cc), and hooks for the test and bench/w8a8. Not part of the model API.
#pragma once

#include <cstdint>

#include "kernels/gemm_int8.h"
#include "kernels/isa.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels::internal {

// Row stride of the avx2 level's widened x for n_in: even (k-pairs), a multiple of 16 (32 B).
inline int64_t WidenedStride(int64_t n_in) { return (n_in + 15) / 16 * 16; }

// x16[i * ldx16 + k] = x[i * ldx + k] for k < n, 0 for n <= k < ldx16.
void WidenRows(const int8_t* x, int64_t m, int64_t n, int64_t ldx, int16_t* x16, int64_t ldx16);

// The avx2 level's paths for outputs j in [j_begin, j_end) of rows [i_begin, i_end) of p (x
// prepared by avx2::Int8Prepare) on the calling thread. REQUIRES: non-empty ranges, n_in >= 1.
// Weight-streaming path (meant for small m; any m works).
void GemmInt8SmallM(const Int8Problem& p, int64_t i_begin, int64_t i_end, int64_t j_begin,
                    int64_t j_end);
// Packed-panel tiled path (meant for large m; any m works).
void GemmInt8Tiled(const Int8Problem& p, int64_t i_begin, int64_t i_end, int64_t j_begin,
                   int64_t j_end);

// GemmInt8 / GemmInt8Acc run on the kernels of `isa` (REQUIRES: isa <= DetectedIsa()),
// whatever the active level. y is fp32 when x_scales != nullptr, else raw int32.
void GemmInt8WithIsa(Isa isa, const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx,
                     const Int8WeightView& w, void* y, int64_t ldy, ThreadPool* pool);

}  // namespace pdserve::kernels::internal
