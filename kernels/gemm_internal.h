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

// Packed-panel tiled path for large m (any m works).
void GemmTiled(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
               int64_t j_end, float* y, int64_t ldy, ThreadPool* pool);

}  // namespace pdserve::kernels::internal
