// FP8 E4M3 weights with 128x128 block scales, DeepSeek's checkpoint format, in one place for the
// loader (model/weights.cc) and the converter (model/tools/convert.cc):
//
//   <name>            F8_E4M3 [n_out, n_in]          codes (common/dtype.h decodes them)
//   <name>_scale_inv  F32 [ceil(n_out/128), ceil(n_in/128)]
//   w[r][k] = fp8(<name>[r][k]) * scale_inv[r / 128][k / 128]
//
// The last block row / column is ragged when n_out / n_in is not a multiple of 128. Codes 0x7f
// and 0xff are NaN (e4m3fn has no infinity); DequantFp8Rows passes them through as NaN.
// Thread-safety: pure functions; distinct rows may be dequantized concurrently.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/safetensors.h"

namespace pdserve::model {

constexpr int64_t kFp8BlockSize = 128;

// "<weight_name>_scale_inv".
std::string Fp8ScaleName(const std::string& weight_name);

// Checks that `weight` (an F8_E4M3 tensor named `name`) is a matrix and that `scale` (its
// <name>_scale_inv; nullptr when absent) is F32 of the block grid's shape. Reads headers only.
// Errors: InvalidArgument naming the tensor and the expected shape.
Status CheckFp8BlockScales(const std::string& name, const TensorInfo& weight, const TensorInfo* scale);

// Rows [r0, r1) of an FP8 matrix with n_in columns as fp32, (r1 - r0) * n_in values to `out`.
// `codes` and `scale_inv` are the whole tensors (row r starts at codes + r * n_in).
// REQUIRES: 0 <= r0 <= r1 <= n_out; scale_inv holds ceil(n_in / 128) values per block row.
void DequantFp8Rows(const uint8_t* codes, const float* scale_inv, int64_t n_in, int64_t r0, int64_t r1, float* out);

// True if any of the n codes is a NaN code (0x7f or 0xff).
bool HasFp8Nan(const uint8_t* codes, int64_t n);

}  // namespace pdserve::model
