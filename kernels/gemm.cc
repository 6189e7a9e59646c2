// Entry points of kernels/gemm.h: argument checks and the choice of path (by m only, so that
// results do not depend on the slice, the strides or the thread count).
#include "kernels/gemm.h"

#include "common/check.h"
#include "kernels/gemm_internal.h"

namespace pdserve::kernels {

void GemmRows(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
              int64_t j_end, float* y, int64_t ldy, ThreadPool* pool) {
  PDSERVE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16, "Gemm: weight dtype");
  PDSERVE_DCHECK(0 <= j_begin && j_begin <= j_end && j_end <= w.n_out, "GemmRows: slice");
  PDSERVE_DCHECK(ldx >= w.n_in && ldy >= j_end && w.ld >= w.n_in, "Gemm: strides");
  if (m <= 0 || j_begin >= j_end) return;
  if (w.n_in <= 0) {  // empty sum
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = j_begin; j < j_end; ++j) y[i * ldy + j] = 0.0f;
    }
    return;
  }
  if (m <= kGemmSmallMMax) {
    internal::GemmSmallM(x, m, ldx, w, j_begin, j_end, y, ldy, pool);
  } else {
    internal::GemmTiled(x, m, ldx, w, j_begin, j_end, y, ldy, pool);
  }
}

void Gemm(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy,
          ThreadPool* pool) {
  GemmRows(x, m, ldx, w, 0, w.n_out, y, ldy, pool);
}

}  // namespace pdserve::kernels
