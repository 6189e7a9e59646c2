// Dense GEMM / GEMV against read-only weight matrices: y = x W^T (the Hugging Face Linear layout).
//
// Two code paths, picked by m (the number of activation rows) only:
//   * m <= kGemmSmallMMax ("decode"): every weight row is streamed once; all m rows of x are
//     FMA'd against it in 8-lane accumulators, horizontally summed at the end. Memory-bound.
//   * larger m ("prefill", tiled): AVX2 FMA microkernels with 12 ymm accumulators. For 12 <= m <= 128
//     x is packed once per call and weights are broadcast in place (bf16 widened on the fly);
//     otherwise weight panels (bf16 -> fp32, transposed) go through a 256 KiB thread-local
//     buffer per (128 weight rows x 512 k) block. Compute-bound.
//   See docs/kernels-gemm.md for the design and measured figures.
// The weight matrix stays in its [n_out, n_in] row-major layout (it may be an mmap'd checkpoint):
// kernels never modify it and never copy it whole.
//
// Numerics: fp32 products of fp32 x and fp32-or-bf16 w (bf16 widened exactly), fp32 accumulation.
// Results are bitwise deterministic for a given (m, n_in) regardless of the thread count, of the
// pool, of the output slice (GemmRows) and of strides: every output's summation order depends on
// n_in and on which path m selects, nothing else.
//   prefill path: one sequential fp32 FMA chain over k = 0 .. n_in-1;
//   decode path: 8 lane-wise chains over k (lane l takes k = l mod 8), a fixed pairwise
//                horizontal sum, then the n_in mod 8 tail added sequentially.
//
// Threading: work is split through ThreadPool::ParallelFor (the calling thread takes part);
// pool == nullptr runs on the calling thread. Kernels never start threads, never log, and never
// allocate per call except for growing reused thread-local scratch the first times (on the
// calling thread: m * n_in floats of packed or realigned x; on every thread: 256 KiB of panels).
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

// m at or below which the weight-streaming (decode) path is used; above it the tiled path.
// Chosen with bench/gemm on the 2-core AMD EPYC (Zen 5) dev VM: see docs/kernels-gemm.md.
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

}  // namespace pdserve::kernels
