// Symmetric per-row INT8 quantization: the dynamic per-token activation quantizer of W8A8
// (one scale per activation row), also used for per-output-channel weight scales (one row per
// output) by the converter and for an INT8 latent cache (one scale per token).
//
// Per row of n values:  amax = max_k |x[k]|;  scale = amax / 127  (fp32 division);
//                       q[k] = clamp(round_half_even(x[k] * (127 / amax)), -127, 127).
// A row of zeros gets scale 0 and codes 0 (so q * scale reproduces it exactly). Codes never use
// -128: the range is symmetric, so negating a code never overflows.
// Error: |x - q * scale| <= scale / 2 (+ a few fp32 ulps of x from the product x * (127/amax)).
// The AVX2 body and the scalar tail use the same fp32 operations, so results are bitwise equal
// to the scalar build. Non-finite inputs give unspecified (but in-range) codes.
// Thread-safety: pure functions; no allocation, no threads.
#pragma once

#include <cstdint>

namespace pdserve::kernels {

inline constexpr int32_t kInt8QuantMax = 127;

// Quantizes rows x[i * ldx + k] (i < m, k < n) to q[i * ldq + k] with scales[i].
// REQUIRES: ldx >= n, ldq >= n; q and scales do not alias x. m or n may be 0 (n == 0 gives
// scale 0).
void QuantizeRowsInt8(const float* x, int64_t m, int64_t n, int64_t ldx, int8_t* q, int64_t ldq,
                      float* scales);

// x[i * ldx + k] = q[i * ldq + k] * scales[i] (fp32 product, exact for |q| <= 127 up to the
// one rounding of the multiply).
void DequantizeRowsInt8(const int8_t* q, const float* scales, int64_t m, int64_t n, int64_t ldq,
                        float* x, int64_t ldx);

// The maximum of |x[k]| over k < n (0 for n == 0), as QuantizeRowsInt8 computes it.
float AbsMax(const float* x, int64_t n);

}  // namespace pdserve::kernels
