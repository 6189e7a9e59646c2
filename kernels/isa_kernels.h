// Declarations of every ISA level's kernel functions, gathered into tables by
// kernel_tables.cc (internal to kernels/). Each namespace's functions live in files compiled
// with that level's flags (kernels/CMakeLists.txt) and may only run where the level is
// supported. Signatures are those of kernel_table.h's FloatKernels / Int8Kernels.
#pragma once

#include <cstdint>

#include "kernels/kernel_table.h"

namespace pdserve::kernels::internal {

#define PDSERVE_FLOAT_KERNELS(prefix)                                                          \
  int64_t prefix##PreparedBytes(int64_t m, int64_t n_in);                                     \
  void prefix##Prepare(const float* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1,        \
                       int64_t n_in, void* xp, uint8_t* terms);                               \
  void prefix##Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1);

#define PDSERVE_INT8_KERNELS(prefix)                                                           \
  int64_t prefix##PreparedBytes(int64_t m, int64_t n_in);                                     \
  void prefix##Prepare(const int8_t* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1,       \
                       int64_t n_in, void* xp, uint8_t* terms);                               \
  void prefix##Compute(const Int8Problem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1);

namespace avx2 {
PDSERVE_FLOAT_KERNELS(F32)   // gemm_avx2.cc
PDSERVE_FLOAT_KERNELS(Bf16)  // gemm_avx2.cc
// kPanels16 BF16 weights (x prepared by Bf16Prepare).
void Bf16PanelsCompute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1);
PDSERVE_INT8_KERNELS(Int8)   // gemm_int8_avx2.cc
}  // namespace avx2

namespace avx512 {
// F32 / BF16 weights: x prepared by avx2's F32Prepare (fp32 rows).
void F32Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1);
void Bf16Compute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1);
void Bf16PanelsCompute(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1);
PDSERVE_INT8_KERNELS(Int8)   // gemm_avx512.cc
}  // namespace avx512

namespace amx {
PDSERVE_INT8_KERNELS(Int8)   // gemm_amx.cc (BF16 weights use avx512's kernels)
}  // namespace amx

#undef PDSERVE_FLOAT_KERNELS
#undef PDSERVE_INT8_KERNELS

}  // namespace pdserve::kernels::internal
