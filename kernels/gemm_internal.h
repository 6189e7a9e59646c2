// Internals of kernels/gemm.h shared by gemm.cc, gemm_small_m.cc, gemm_tiled.cc, the test and
// bench/gemm (which times each path on its own). Not part of the model-facing API.
#pragma once

#include <cstdint>

#include "kernels/gemm.h"

namespace pdserve::kernels::internal {

// Both paths compute outputs j in [j_begin, j_end) of y = x W^T, writing y[i * ldy + j].
// REQUIRES: m >= 1, w.n_in >= 1, j_begin < j_end, Gemm's other requirements.
// Threading as in gemm.h.

// Weight-streaming path for small m (any m works; meant for m <= kGemmSmallMMax).
void GemmSmallM(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
                int64_t j_end, float* y, int64_t ldy, ThreadPool* pool);

// Tiled path for m > kGemmSmallMMax (any m works): GemmTiledPackX for moderate m (12..128),
// else GemmTiledPanels. Both give the same bits (one sequential FMA chain per output over k).
void GemmTiled(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
               int64_t j_end, float* y, int64_t ldy, ThreadPool* pool);
// Weight panels packed (transposed) per block, x read in place; for large m.
void GemmTiledPanels(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
                     int64_t j_end, float* y, int64_t ldy, ThreadPool* pool);
// x packed once per call, weights broadcast in place; for moderate m (x scratch ~ m * n_in).
void GemmTiledPackX(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
                    int64_t j_end, float* y, int64_t ldy, ThreadPool* pool);

}  // namespace pdserve::kernels::internal
