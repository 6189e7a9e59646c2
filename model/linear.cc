#include "model/linear.h"

namespace pdserve::model {

void ApplyLinear(const Linear& w, const float* x, int64_t m, float* y, ThreadPool* pool) {
  kernels::Gemm(x, m, w.n_in(), w.view, y, w.n_out(), pool);
}

}  // namespace pdserve::model
