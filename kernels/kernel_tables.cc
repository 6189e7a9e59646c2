// The kernel table of each ISA level (kernel_table.h). Only function addresses here: the
// functions live in files compiled with their level's flags.
#include "kernels/gemm_plan.h"
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
constexpr FloatKernels kAvx2Bf16Panels{1, kAvx2McMax, &avx2::Bf16PreparedBytes, &avx2::Bf16Prepare,
                                       &avx2::Bf16PanelsCompute};
constexpr Int8Kernels kAvx2Int8{1, 512, &avx2::Int8PreparedBytes, &avx2::Int8Prepare,
                                &avx2::Int8Compute};

// avx512: 12-row microkernels against packed 32-row panels, for any m; rows per task as for
// avx2 (panels are packed once per task). x is prepared as for avx2 (fp32 rows).
constexpr FloatKernels kAvx512F32{1, 512, &avx2::F32PreparedBytes, &avx2::F32Prepare,
                                  &avx512::F32Compute};
constexpr FloatKernels kAvx512Bf16{1, 512, &avx2::Bf16PreparedBytes, &avx2::Bf16Prepare,
                                   &avx512::Bf16Compute};
constexpr FloatKernels kAvx512Bf16Panels{1, 512, &avx2::Bf16PreparedBytes, &avx2::Bf16Prepare,
                                         &avx512::Bf16PanelsCompute};
// Dot products over k with the task's rows in groups of 4: the weight block is re-read from
// L1/L2 per group, so tasks keep few rows (their x stays in L2).
constexpr Int8Kernels kAvx512Int8{1, 64, &avx512::Int8PreparedBytes, &avx512::Int8Prepare,
                                  &avx512::Int8Compute};
// amx: x in 16-row B tiles.
constexpr Int8Kernels kAmxInt8{16, 256, &amx::Int8PreparedBytes, &amx::Int8Prepare,
                               &amx::Int8Compute};

}  // namespace

void* ThreadScratch(int slot, int64_t bytes) {
  thread_local AlignedBuffer buffers[kScratchSlots];
  return buffers[slot].Get(bytes);
}

const KernelTable kAvx2Table{Isa::kAvx2, kAvx2F32, kAvx2Bf16, kAvx2Bf16Panels, kAvx2Int8};
const KernelTable kAvx512Table{Isa::kAvx512, kAvx512F32, kAvx512Bf16, kAvx512Bf16Panels, kAvx512Int8};
const KernelTable kAmxTable{Isa::kAmx, kAvx512F32, kAvx512Bf16, kAvx512Bf16Panels, kAmxInt8};

}  // namespace pdserve::kernels::internal
