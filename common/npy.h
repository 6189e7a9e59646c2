// Minimal NumPy .npy (format 1.0, little-endian, C order) reader and writer for float32 and
// int32 arrays: logits dumps, golden reference outputs and per-layer dumps.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve {

struct NpyArray {
  std::string descr;             // "<f4" or "<i4"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;    // raw little-endian data, product(shape) * itemsize
  int64_t numel() const;
  const float* f32() const { return reinterpret_cast<const float*>(bytes.data()); }
  const int32_t* i32() const { return reinterpret_cast<const int32_t*>(bytes.data()); }
};

Status WriteNpyF32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
Status WriteNpyI32(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);
// Errors: NotFound, InvalidArgument (not a v1/v2 npy of <f4/<i4, Fortran order, truncated).
Result<NpyArray> ReadNpy(const std::string& path);

}  // namespace pdserve
