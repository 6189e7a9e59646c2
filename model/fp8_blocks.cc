#include "model/fp8_blocks.h"

#include <algorithm>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common/dtype.h"

namespace pdserve::model {

std::string Fp8ScaleName(const std::string& weight_name) { return weight_name + "_scale_inv"; }

Status CheckFp8BlockScales(const std::string& name, const TensorInfo& weight, const TensorInfo* scale) {
  if (weight.shape.size() != 2)
    return Status::InvalidArgument("F8_E4M3 tensor '" + name + "' is not a matrix: " + weight.ShapeString(), weight.file);
  const std::string sname = Fp8ScaleName(name);
  if (!scale) return Status::InvalidArgument("F8_E4M3 tensor '" + name + "' has no '" + sname + "'", weight.file);
  const int64_t rb = (weight.shape[0] + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t cb = (weight.shape[1] + kFp8BlockSize - 1) / kFp8BlockSize;
  if (scale->dtype != DType::kF32 || scale->shape != std::vector<int64_t>{rb, cb})
    return Status::InvalidArgument("tensor '" + sname + "' must be F32 [" + std::to_string(rb) + ", " +
                                       std::to_string(cb) + "], got " + std::string(DTypeName(scale->dtype)) + " " +
                                       scale->ShapeString(),
                                   scale->file);
  return Status::Ok();
}

void DequantFp8Rows(const uint8_t* codes, const float* scale_inv, int64_t n_in, int64_t r0, int64_t r1, float* out) {
  const float* table = Fp8E4M3DecodeTable();
  const int64_t cb = (n_in + kFp8BlockSize - 1) / kFp8BlockSize;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = codes + r * n_in;
    const float* srow = scale_inv + (r / kFp8BlockSize) * cb;
    float* o = out + (r - r0) * n_in;
    for (int64_t k0 = 0; k0 < n_in; k0 += kFp8BlockSize) {  // one block column at a time
      const int64_t k1 = std::min(n_in, k0 + kFp8BlockSize);
      const float sc = srow[k0 / kFp8BlockSize];
      int64_t k = k0;
#if defined(__AVX2__)
      const __m256 vs = _mm256_set1_ps(sc);
      for (; k + 8 <= k1; k += 8) {
        const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + k)));
        _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_i32gather_ps(table, idx, 4), vs));
      }
#endif
      for (; k < k1; ++k) o[k] = table[p[k]] * sc;
    }
  }
}

bool HasFp8Nan(const uint8_t* codes, int64_t n) {
  int64_t k = 0;
#if defined(__AVX2__)
  const __m256i m = _mm256_set1_epi8(0x7f);
  __m256i any = _mm256_setzero_si256();
  for (; k + 32 <= n; k += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k));
    any = _mm256_or_si256(any, _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m));
  }
  if (_mm256_movemask_epi8(any) != 0) return true;
#endif
  for (; k < n; ++k)
    if ((codes[k] & 0x7f) == 0x7f) return true;
  return false;
}

}  // namespace pdserve::model
