// Scalar reference for kernels/gemm.h: the plain triple loop, accumulating in double.
// Header-only (kernels/CMakeLists.txt compiles kernels/*.cc only). Slow; for tests and benches.
// Thread-safety: pure function of its arguments; `pool` is ignored (runs on the caller).
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/gemm.h"

namespace pdserve::kernels {

// Element (j, k) of W as fp32 (bf16 widened exactly).
inline float WeightAt(const WeightView& w, int64_t j, int64_t k) {
  if (w.dtype == DType::kBF16) return Bf16ToF32(static_cast<const uint16_t*>(w.data)[j * w.ld + k]);
  return static_cast<const float*>(w.data)[j * w.ld + k];
}

// Same contract as GemmRows; sums of exact fp32 products in double, rounded once to fp32.
inline void GemmRowsRef(const float* x, int64_t m, int64_t ldx, const WeightView& w,
                        int64_t j_begin, int64_t j_end, float* y, int64_t ldy,
                        ThreadPool* /*pool*/) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = j_begin; j < j_end; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < w.n_in; ++k) {
        s += static_cast<double>(x[i * ldx + k]) * static_cast<double>(WeightAt(w, j, k));
      }
      y[i * ldy + j] = static_cast<float>(s);
    }
  }
}

// Same contract as Gemm.
inline void GemmRef(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y,
                    int64_t ldy, ThreadPool* pool) {
  GemmRowsRef(x, m, ldx, w, 0, w.n_out, y, ldy, pool);
}

}  // namespace pdserve::kernels
