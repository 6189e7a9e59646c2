// Dense GEMM / GEMV against read-only weight matrices: y = x W^T (the Hugging Face Linear layout).
//
// One kernel family per ISA level (kernels/isa.h; chosen once per process), each with ONE
// summation order per output for every m: a row's result is bitwise the same whether it is
// computed alone (m = 1, decode) or with any other rows (a decode batch, a prefill chunk), on
// any thread count, slice (GemmRows) or stride. So the tiled kernels serve decode batches too
// and callers need not group rows to keep a request's numbers independent of its batch.
//   avx2:   fp32 FMA, 8 lanes; per step of 16 k two FMAs per lane (F32 weights: k = l, l + 8;
//           BF16: the bf16 pairs unpacked as k = a(l), a(l) + 4 with a(l) = l + 4 (l >= 4)),
//           then the fixed 8-lane tree ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
//   avx512: BF16 weights: vdpbf16ps, 16 lanes of k pairs, x split exactly into up to three
//           bf16 terms (hi + mid + lo; one term when x is bf16-exact, as every projection
//           input of the model is), then a fixed 16-lane tree. F32 weights: the avx2 kernel.
//   amx:    BF16 weights: tdpbf16ps tiles (weights as the A tile, read in place), per 32-k
//           step the hi, mid, lo terms of x; F32 weights: the avx2 kernel.
// The orders differ between levels (results agree to fp32 rounding, not bitwise); per level
// they depend on n_in only. See docs/kernels-gemm.md for the design and measured figures.
// The weight matrix stays in its [n_out, n_in] row-major layout (it may be an mmap'd checkpoint):
// kernels never modify it and never copy it whole.
//
// Numerics: products of x and the bf16/fp32 weights are exact (fp32 FMA; or bf16 x bf16 terms
// of an exact split of x), sums are fp32. The bf16 dot-product instructions treat bf16
// denormals (|v| < 2^-126) as zero and flush denormal sums: values far below anything a model
// layer produces.
//
// Threading: work is split through ThreadPool::ParallelFor (the calling thread takes part);
// pool == nullptr runs on the calling thread. Kernels never start threads, never log, and never
// allocate per call except for growing reused thread-local scratch the first times (on the
// calling thread: the prepared x, at most 16 MiB per wave; larger calls go in row chunks).
// Safe to call concurrently from several threads with different pools (or none).
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/thread_pool.h"

namespace pdserve::kernels {

// A read-only weight matrix W of shape [n_out, n_in], row-major (the Hugging Face Linear
// layout: y = x W^T), stored as F32 or BF16, with row stride ld (elements, >= n_in).
// The data may live in an mmap'd checkpoint: kernels never modify or copy the whole matrix.
struct WeightView {
  DType dtype;  // DType::kF32 or DType::kBF16
  const void* data;
  int64_t n_out;
  int64_t n_in;
  int64_t ld;  // elements between consecutive rows
};

// Rows per call some callers (model/) still cut their batches into. Results no longer depend on
// m at all (see above), so this only bounds those callers' scratch; it selects nothing here.
inline constexpr int64_t kGemmSmallMMax = 8;

// y[i, j] = sum_k x[i, k] * W[j, k]   for i < m, j < w.n_out   (fp32 accumulation)
// x: [m, w.n_in] fp32 with row stride ldx; y: [m, w.n_out] fp32 with row stride ldy.
// REQUIRES: ldx >= w.n_in, ldy >= w.n_out, y does not alias x (nor W). m may be 0 (no-op).
// w.n_in == 0 writes zeros. w.dtype is kF32 or kBF16 (anything else aborts).
// Runs on `pool` (its calling thread included); pool == nullptr runs on the calling thread.
void Gemm(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy,
          ThreadPool* pool);

// Same with a slice of W's rows: only outputs j in [j_begin, j_end) are computed and written,
// at their usual places y[i * ldy + j] (y still points at output column 0). Each written value
// is bitwise equal to what Gemm writes there.
// REQUIRES: 0 <= j_begin <= j_end <= w.n_out, ldy >= j_end, plus Gemm's requirements.
void GemmRows(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
              int64_t j_end, float* y, int64_t ldy, ThreadPool* pool);

// One GEMM of a grouped call (e.g. one expert's gate_proj on the rows routed to it).
struct GemmGroup {
  WeightView w;
  const float* x = nullptr;
  int64_t m = 0;  // 0 allowed (an expert no row was routed to): skipped
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

// Runs every group's Gemm in one parallel region: the (group, row block, output block) tasks
// of all groups are handed out together, so many small experts keep every thread busy without
// a fork/join each. Adjacent groups with the same x (gate and up of one expert) share its
// preparation. Each output is bitwise what Gemm writes there.
// REQUIRES: each group meets Gemm's requirements; distinct groups' y do not overlap.
void GroupedGemm(const GemmGroup* groups, int64_t n_groups, ThreadPool* pool);

}  // namespace pdserve::kernels
