// The kernel table of each ISA level (kernel_table.h). Only function addresses here: the
// functions live in files compiled with their level's flags.
#include "kernels/isa_kernels.h"

namespace pdserve::kernels::internal {
namespace {

// Rows of x per task for the avx2 float kernels: the tiled path packs each task's weight
// panels once, so tasks cut the outputs before the rows (as the tiled path always did).
constexpr int64_t kAvx2McMax = 512;

constexpr FloatKernels kAvx2F32{1, kAvx2McMax, &avx2::F32PreparedBytes, &avx2::F32Prepare,
                                &avx2::F32Compute};
constexpr FloatKernels kAvx2Bf16{1, kAvx2McMax, &avx2::Bf16PreparedBytes, &avx2::Bf16Prepare,
                                 &avx2::Bf16Compute};
constexpr Int8Kernels kAvx2Int8{1, 512, &avx2::Int8PreparedBytes, &avx2::Int8Prepare,
                                &avx2::Int8Compute};

}  // namespace

const KernelTable kAvx2Table{Isa::kAvx2, kAvx2F32, kAvx2Bf16, kAvx2Int8};
const KernelTable kAvx512Table{Isa::kAvx512, kAvx2F32, kAvx2Bf16, kAvx2Int8};
const KernelTable kAmxTable{Isa::kAmx, kAvx2F32, kAvx2Bf16, kAvx2Int8};

}  // namespace pdserve::kernels::internal
