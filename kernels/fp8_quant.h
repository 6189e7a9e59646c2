// The reference's fp8 activation quantization ("act_quant", block 128, ue8m0 scales) and the
// exact fp8 dot product the Lightning Indexer scores with.
//
// Per block of 128 contiguous values: amax = max(|x|) floored at 1e-4; s = amax * fp32(1/448);
// s is rounded UP to a power of two (from its fp32 bits); codes = e4m3(clamp(x / s, +-448))
// with round-to-nearest-even. The dequantized value is e4m3(code) * s, exactly representable
// as fp8 + one exponent, which is why the latent KV cache can store it losslessly.
#pragma once

#include <cstdint>

namespace pdserve::kernels {

constexpr int64_t kFp8BlockSize = 128;

// The power-of-two scale of one block (amax already computed).
float Fp8BlockScale(float amax);

// codes[i] = F32ToFp8E4M3(x[i]) (common/dtype.h) for i < n, bit for bit, 8 values per step.
void F32ToFp8E4M3Rows(const float* x, int64_t n, uint8_t* codes);

// Quantizes n values (REQUIRES n % 128 == 0): codes[n], scales[n / 128]. Vectorized; bitwise
// the scalar definition above (amax, Fp8BlockScale, clamp(x / s), F32ToFp8E4M3).
void ActQuantFp8(const float* x, int64_t n, uint8_t* codes, float* scales);

// x <- dequant(quant(x)) in place (the fp8 round trip of the MLA latent).
void Fp8RoundTripInPlace(float* x, int64_t n);

// Exact dot product of two fp8 code vectors of length n, rounded once to fp32. Every product
// of two e4m3 values and their sum over 128 elements is exact in double (51 bits suffice), so
// the result does not depend on summation order.
float Fp8DotExact(const uint8_t* a, const uint8_t* b, int64_t n);

// Same with `a` already decoded to double (the query side, decoded once per query).
float Fp8DotExactDecodedA(const double* a, const uint8_t* b, int64_t n);

// Tables for decoding e4m3 codes by byte permutes (the AVX512-VBMI kernels of the indexer and
// of the attention's staging). Fp8MagnitudeBf16Bytes: for each 7-bit magnitude code c, the high
// and low bytes of the bf16 of its value times `mul` (the value as the fp16 route decodes it:
// (c << 7) read as fp16 is value / 256, code 0x7f included; `mul` a power of two keeping every
// value normal, so the bytes are exact).
void Fp8MagnitudeBf16Bytes(float mul, uint8_t hi[128], uint8_t lo[128]);
// Permute indices that interleave a plane of low bytes (indices 0..63) and one of high bytes
// (64..127) into 32-bit words: in pick[g], word w holds the bf16 of value 32g + w in its low
// half and of value 32g + 16 + w in its high half (the staging's paired layout; the indexer's
// keys of lanes 0 / 1 and 2 / 3).
void PairedWordPicks(uint8_t pick[2][64]);

}  // namespace pdserve::kernels
