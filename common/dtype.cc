#include "common/dtype.h"

#include <immintrin.h>

#include <array>
#include <cmath>
#include <limits>

namespace pdserve {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kI8: return "I8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
  }
  return "?";
}

bool ParseDType(std::string_view name, DType* out) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16},
      {"F8_E4M3", DType::kF8E4M3}, {"I8", DType::kI8}, {"I32", DType::kI32},
      {"I64", DType::kI64}, {"U8", DType::kU8}};
  for (const auto& [n, d] : kNames) {
    if (n == name) {
      *out = d;
      return true;
    }
  }
  return false;
}

float F16ToF32(uint16_t bits) { return _cvtsh_ss(bits); }
uint16_t F32ToF16Bits(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

namespace {
std::array<float, 256> BuildFp8Table() {
  std::array<float, 256> t{};
  for (int code = 0; code < 256; ++code) {
    const int sign = code >> 7;
    const int exp = (code >> 3) & 0xf;
    const int man = code & 0x7;
    float v;
    if (exp == 0xf && man == 0x7) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
    } else {
      v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
    }
    t[code] = sign ? -v : v;
  }
  return t;
}
}  // namespace

const float* Fp8E4M3DecodeTable() {
  static const std::array<float, 256> table = BuildFp8Table();
  return table.data();
}

uint8_t F32ToFp8E4M3(float x) {
  if (std::isnan(x)) return 0x7f;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 31) << 7);
  float a = std::fabs(x);
  if (a >= kFp8E4M3Max) return sign | 0x7e;  // saturate (448 = 0x7e)
  // Quantum of the e4m3 grid at a's binade: 2^(e-3) for normals (e >= -6), 2^-9 below.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): binade exponent is e-1
  int binade = e - 1;
  if (binade < -6) binade = -6;
  const float quantum = std::ldexp(1.0f, binade - 3);
  // a / quantum is exact in fp32 (power-of-two scaling); nearbyint rounds half to even.
  float q = std::nearbyint(a / quantum) * quantum;
  if (q > kFp8E4M3Max) q = kFp8E4M3Max;
  // Encode q exactly.
  if (q == 0.0f) return sign;
  int qe;
  float qm = std::frexp(q, &qe);  // q = qm * 2^qe, qm in [0.5,1)
  int exp_field = qe - 1 + 7;
  uint8_t code;
  if (exp_field <= 0) {
    code = static_cast<uint8_t>(std::lround(q / std::ldexp(1.0f, -9)));  // subnormal mantissa
  } else {
    const int man = static_cast<int>(std::lround((qm * 2.0f - 1.0f) * 8.0f));
    code = static_cast<uint8_t>((exp_field << 3) | man);
  }
  return sign | code;
}

}  // namespace pdserve
