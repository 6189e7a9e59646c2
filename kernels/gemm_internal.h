// Internals of kernels/gemm.h shared by the test and bench/gemm. Not part of the model API.
#pragma once

#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/isa.h"

namespace pdserve::kernels::internal {

// Gemm run on the kernels of `isa` (REQUIRES: isa <= DetectedIsa()), whatever the active level.
void GemmWithIsa(Isa isa, const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y,
                 int64_t ldy, ThreadPool* pool);

}  // namespace pdserve::kernels::internal
