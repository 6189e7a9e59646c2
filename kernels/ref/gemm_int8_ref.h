// Scalar references for kernels/gemm_int8.h and kernels/quantize.h: plain loops, int64
// accumulation (so an int32 overflow in the kernel would show), then the kernel's epilogue
// formula. Header-only; slow; for tests and benches. Pure functions.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/gemm_int8.h"

namespace pdserve::kernels {

// acc[i * ldacc + j] = sum_k xq[i, k] * W[j, k] in int64.
inline void GemmInt8AccRef(const int8_t* xq, int64_t m, int64_t ldx, const Int8WeightView& w,
                           int64_t* acc, int64_t ldacc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.n_out; ++j) {
      int64_t s = 0;
      for (int64_t k = 0; k < w.n_in; ++k) s += int64_t{xq[i * ldx + k]} * w.data[j * w.ld + k];
      acc[i * ldacc + j] = s;
    }
  }
}

// y = (float(acc) * x_scales[i]) * w.scales[j], acc as above (REQUIRES |acc| < 2^31).
inline void GemmInt8Ref(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx,
                        const Int8WeightView& w, float* y, int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < w.n_out; ++j) {
      int64_t s = 0;
      for (int64_t k = 0; k < w.n_in; ++k) s += int64_t{xq[i * ldx + k]} * w.data[j * w.ld + k];
      y[i * ldy + j] = (static_cast<float>(static_cast<int32_t>(s)) * x_scales[i]) * w.scales[j];
    }
  }
}

// Per-row symmetric quantization, written from the formula in kernels/quantize.h.
inline void QuantizeRowsInt8Ref(const float* x, int64_t m, int64_t n, int64_t ldx, int8_t* q,
                                int64_t ldq, float* scales) {
  for (int64_t i = 0; i < m; ++i) {
    float amax = 0.0f;
    for (int64_t k = 0; k < n; ++k) amax = std::fmax(amax, std::fabs(x[i * ldx + k]));
    scales[i] = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t k = 0; k < n; ++k) {
      float v = x[i * ldx + k] * inv;
      v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
      q[i * ldq + k] = static_cast<int8_t>(std::nearbyint(v));
    }
  }
}

}  // namespace pdserve::kernels
