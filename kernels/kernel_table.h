// The dispatch table behind kernels/gemm.h and kernels/gemm_int8.h (internal to kernels/).
//
// Each ISA level (kernels/isa.h) fills in one KernelTable: how it prepares the activations of a
// GEMM and the compute routine that runs one (rows x outputs) task of it. The entry points
// (gemm.cc, gemm_int8.cc) do the ISA-neutral part once: argument checks, task planning over
// one or many GEMMs (grouped calls), thread-pool hand-off, scratch. A later accelerator backend
// would sit beside these tables behind the same entry points; callers never see an ISA.
//
// Numerics contract of every table (what makes results independent of the batch):
//   * compute() gives each output y[i, j] by a fixed function of row i of x, row j of W and
//     n_in: the same bits whatever the task bounds (i0, i1, j0, j1), the other rows of x in the
//     call, m, the thread count or the slice. No split-K. Per-ISA summation orders are
//     documented in docs/kernels-gemm.md.
//   * INT8: exact int32 sums, so every table gives the same bits as every other.
// Thread-safety: tables are immutable; compute() runs concurrently on disjoint outputs.
#pragma once

#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gemm_int8.h"
#include "kernels/isa.h"

namespace pdserve::kernels::internal {

// An fp32-activation GEMM as compute() sees it: x already prepared by the same table.
struct FloatProblem {
  const void* xp = nullptr;         // prepared rows [0, m) of x (layout private to the table)
  const uint8_t* terms = nullptr;   // per granule of rows: bf16 terms of x to use (1..3)
  int64_t m = 0;
  WeightView w;
  float* y = nullptr;
  int64_t ldy = 0;
};

// An int8 GEMM as compute() sees it.
struct Int8Problem {
  const void* xp = nullptr;         // prepared rows [0, m) of xq
  const uint8_t* terms = nullptr;   // unused (kept for the shared driver)
  const float* x_scales = nullptr;  // unused when raw
  int64_t m = 0;
  Int8WeightView w;
  void* y = nullptr;  // float* (dequantized) or int32_t* (raw)
  int64_t ldy = 0;
  bool raw = false;
};

struct FloatKernels {
  int m_granule = 1;   // task row ranges start on multiples of this (prepared units of rows)
  int64_t mc_max = 0;  // most rows of x per task (the task's x should stay in L2)
  // Bytes of prepared x for m rows (m rounded up to m_granule) and n_in; 64-byte multiple.
  int64_t (*prepared_bytes)(int64_t m, int64_t n_in) = nullptr;
  // Prepares rows [i0, i1) (i0 a multiple of m_granule, i1 = m or a multiple) of x into the
  // buffer xp of the whole problem, and their terms[] entries (one per granule).
  void (*prepare)(const float* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1, int64_t n_in,
                  void* xp, uint8_t* terms) = nullptr;
  // Writes y[i, j] for i in [i0, i1), j in [j0, j1). REQUIRES: non-empty ranges, n_in >= 1,
  // i0 a multiple of m_granule.
  void (*compute)(const FloatProblem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) = nullptr;
};

struct Int8Kernels {
  int m_granule = 1;
  int64_t mc_max = 0;
  int64_t (*prepared_bytes)(int64_t m, int64_t n_in) = nullptr;
  void (*prepare)(const int8_t* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1, int64_t n_in,
                  void* xp, uint8_t* terms) = nullptr;
  // Writes y (or raw int32 acc) for i in [i0, i1), j in [j0, j1) (same REQUIRES as above).
  void (*compute)(const Int8Problem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) = nullptr;
};

struct KernelTable {
  Isa isa = Isa::kAvx2;
  FloatKernels f32;   // F32 weights
  FloatKernels bf16;  // BF16 weights, row-major
  FloatKernels bf16_panels;  // BF16 weights prepacked as kPanels16
  Int8Kernels int8;
};

// Per-thread scratch for the kernels of the wider levels: 64-byte aligned, at least `bytes`,
// grow-only, one buffer per slot (a kernel uses its own slot), heap-allocated and freed when the
// thread ends. (Large `static thread_local` arrays would sit in every thread's static TLS,
// which glibc carves out of the thread's stack: threads created with small stacks, such as the
// metrics server's, then fail to start.) Defined in kernel_tables.cc (baseline code).
inline constexpr int kScratchSlots = 4;
void* ThreadScratch(int slot, int64_t bytes);

// Tables of each level, defined in the level's own files (compiled with its flags).
extern const KernelTable kAvx2Table;
extern const KernelTable kAvx512Table;
extern const KernelTable kAmxTable;

// The table of a level. REQUIRES: isa <= DetectedIsa() (its instructions exist here).
const KernelTable& TableFor(Isa isa);
// The table every entry point uses: TableFor(ActiveIsa()) unless a test changed it.
const KernelTable& ActiveTable();
// Whether the active level includes AVX-512: the per-row kernels outside the table (attention,
// indexer) pick their AVX-512 variants by it.
inline bool ActiveIsaHasAvx512() { return ActiveTable().isa >= Isa::kAvx512; }
// Test hook: makes `isa` (REQUIRES <= DetectedIsa()) the active level; returns the previous
// one. Not safe while other threads are inside kernels.
Isa TEST_SetActiveIsa(Isa isa);

}  // namespace pdserve::kernels::internal
