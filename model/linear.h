// Linear: one weight matrix of the model ([n_out, n_in], y = x W^T) and the single entry point
// every projection goes through, so a weight format (BF16, F32, and later INT8 W8A8) is chosen
// in one place.
// Thread-safety: immutable after loading; ApplyLinear may run concurrently on distinct outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/gemm.h"

namespace pdserve::model {

struct Linear {
  kernels::WeightView view{};       // BF16/F32 weights (into the mmap or owned_bf16)
  std::vector<uint16_t> owned_bf16;  // storage when the view is not into the checkpoint
  int64_t n_out() const { return view.n_out; }
  int64_t n_in() const { return view.n_in; }
};

// y[m, n_out] = x[m, n_in] W^T with fp32 accumulation (rows packed: ldx = n_in, ldy = n_out).
void ApplyLinear(const Linear& w, const float* x, int64_t m, float* y, ThreadPool* pool);

}  // namespace pdserve::model
