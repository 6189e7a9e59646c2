// Small per-row kernels of the model: norms, activations, softmax, bf16 rounding, Hadamard,
// top-k. All compute in fp32 (accumulating reductions in fp32 or wider, as named), operate on
// one row (callers split rows across threads), never allocate, never log.
// Each has a scalar reference in kernels/ref/elementwise_ref.h and a test beside it.
#pragma once

#include <cstdint>

namespace pdserve::kernels {

// out[i] = w[i] * x[i] / sqrt(mean(x^2) + eps). The mean is accumulated in double so the
// result does not depend on the vector width. out may alias x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);

// out[i] = (x[i] - mean) / sqrt(var + eps) * w[i] + b[i] (biased variance). out may alias x.
void LayerNorm(const float* x, const float* w, const float* b, int64_t n, float eps, float* out);

// x[i] = bf16(x[i]) (round to nearest even), in place.
void RoundToBf16InPlace(float* x, int64_t n);

// out[i] = bf16(silu(gate[i]) * up[i]) as the reference MLP computes it (gate and up are the
// bf16-rounded projections; the product is formed in fp32)
// (silu(g) = g / (1 + exp(-g)), computed in fp32). out may alias gate.
void SiluMulBf16(const float* gate, const float* up, int64_t n, float* out);

// In-place softmax over n values (max-subtracted, fp32). -inf entries get probability 0, and
// so do entries more than 87 below the maximum (probability < 1.7e-38). The exponential is a
// fixed polynomial (within 2 ulp of exp), the sum a fixed 8-lane order (elementwise.cc): an
// element's result depends only on the n values, never on the ISA or the thread.
// REQUIRES: at least one finite entry.
void Softmax(float* x, int64_t n);

// Softmax(x, n) then RoundToBf16InPlace(x, n), bit for bit on every ISA level: the same
// exponentials, the same 8-lane sum in the same order, the same product by 1 / sum, in fewer
// passes (on AVX-512 16 exponentials a step, and the product rounded as it is stored).
// REQUIRES: x finite (attention scores); n == 0 writes nothing.
void SoftmaxToBf16(float* x, int64_t n);

// In-place unnormalized Walsh-Hadamard transform in natural (Sylvester) order:
// x <- H x with H[i][j] = (-1)^popcount(i & j). REQUIRES: n is a power of two.
void HadamardTransform(float* x, int64_t n);
namespace internal {
// Tests: the scalar butterflies HadamardTransform's vector form must equal bit for bit.
void TEST_HadamardScalar(float* x, int64_t n);
}  // namespace internal

// The k largest scores' indices, returned sorted ascending in out[0..min(k,n)).
// Ties are broken towards the lower index, so the choice is deterministic.
// Returns the number written (min(k, n)). REQUIRES: scratch holds n int32.
int64_t TopKIndices(const float* scores, int64_t n, int64_t k, int32_t* out, int32_t* scratch);

// Dot product of n floats accumulated in fp32 (AVX2 lanes, then a fixed-order reduction).
float DotF32(const float* a, const float* b, int64_t n);

// y[i] += a * x[i]
void Axpy(float a, const float* x, int64_t n, float* y);

}  // namespace pdserve::kernels

namespace pdserve::kernels {
// y[i] += a * row[i] for one row of a BF16 or F32 matrix stored as `dtype` (exact widening).
// REQUIRES: dtype is kF32 or kBF16.
void AxpyRow(float a, const void* row, bool row_is_bf16, int64_t n, float* y);
}  // namespace pdserve::kernels
