// Element types pdserve stores (BF16, F32, INT8, FP8 E4M3, ...) and exact scalar conversions.
//
// CPUs here have no FP8 or BF16 arithmetic: values are stored in those formats and computed in
// fp32. The conversions below are the exact ones the model numerics rely on:
//   * RoundToBf16: fp32 -> bf16 with round-to-nearest-even (NaN stays NaN), as torch does.
//   * Fp8E4M3 encode: round-to-nearest-even, saturating to +-448, with subnormals (the
//     "e4m3fn" format: no infinities, 0x7f/0xff are NaN).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace pdserve {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI8, kI32, kI64, kU8 };

// Size of one element in bytes.
size_t DTypeSize(DType dtype);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", "I8", ...).
std::string_view DTypeName(DType dtype);
// Parses a safetensors dtype string; returns false if unknown.
bool ParseDType(std::string_view name, DType* out);

// ---- bf16 -------------------------------------------------------------------------------------
struct Bf16 {
  uint16_t bits;
};

inline float Bf16ToF32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// fp32 -> bf16 -> fp32: the value the official code holds after rounding a tensor to bf16.
inline float RoundToBf16(float f) { return Bf16ToF32(F32ToBf16Bits(f)); }

// ---- fp16 (IEEE half), via F16C where available ------------------------------------------------
float F16ToF32(uint16_t bits);
uint16_t F32ToF16Bits(float f);

// ---- fp8 e4m3fn ------------------------------------------------------------------------------
constexpr float kFp8E4M3Max = 448.0f;

// Decode table: the exact fp32 value of every code (NaN for 0x7f and 0xff).
const float* Fp8E4M3DecodeTable();
inline float Fp8E4M3ToF32(uint8_t code) { return Fp8E4M3DecodeTable()[code]; }
// Encodes with round-to-nearest-even; |x| > 448 saturates to +-448; NaN -> 0x7f.
uint8_t F32ToFp8E4M3(float x);

}  // namespace pdserve
