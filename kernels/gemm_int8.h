// INT8 x INT8 GEMM for W8A8: y = dequant(xq Wq^T) with exact int32 accumulation.
//
//   acc[i, j] = sum_k xq[i, k] * Wq[j, k]                  (int32, exact)
//   y[i, j]   = (float(acc[i, j]) * x_scales[i]) * w.scales[j]   (fp32, in this order)
// x is quantized per row (per token, kernels/quantize.h), W per output channel (per row), so
// the dequantization is one fused multiply pair in the store epilogue ("fused dequant").
//
// Exactness: both operands are sign-extended to int16 and multiplied with vpmaddwd, which adds
// two int16 x int16 products into an int32 without saturation (|a*b + c*d| <= 2 * 128^2 =
// 2^15). Partial sums then go through int32 adds, exact while |acc| < 2^31: guaranteed for
// n_in <= kGemmInt8MaxK (n_in * 128^2 < 2^31), which every DeepSeek-V3.2 matrix satisfies by far.
// Any int8 value including -128 is handled. Since integer sums are associative, results are
// bitwise identical whatever the path, the thread count, the tiling or the slice.
//
// Two code paths, chosen by m per call (or per group):
//   * m <= kGemmInt8SmallMMax ("decode"): each weight row is streamed once from memory and
//     multiplied with all m rows; memory-bound, reads half the bytes of BF16.
//   * larger m ("prefill"): weight panels widened to int16 and interleaved by k-pairs in a
//     thread-local buffer; a 6x16 microkernel of vpmaddwd/vpaddd; compute-bound.
// x is widened to int16 once per call into a thread-local buffer of the calling thread.
//
// Threading: work goes through ThreadPool::ParallelFor (calling thread included); pool ==
// nullptr runs on the calling thread. No thread start, no logging; allocation only to grow
// reused thread-local scratch buffers the first times.
#pragma once

#include <cstdint>

#include "common/thread_pool.h"

namespace pdserve::kernels {

// A read-only INT8 weight matrix [n_out, n_in] row-major (ld elements between rows) with one
// fp32 scale per output row: W[j, k] ~= data[j * ld + k] * scales[j]. May point into an
// mmap'd checkpoint.
struct Int8WeightView {
  const int8_t* data = nullptr;
  const float* scales = nullptr;
  int64_t n_out = 0;
  int64_t n_in = 0;
  int64_t ld = 0;
};

// Largest n_in for which int32 accumulation is proven exact: n_in * 128^2 < 2^31.
inline constexpr int64_t kGemmInt8MaxK = (int64_t{1} << 17) - 1;

// m at or below which the weight-streaming path is used. Chosen with bench/w8a8 (bench_w8a8
// --only crossover) on the 2-core Zen 5 dev VM: the streaming path is ahead up to m ~ 15 even
// with the weights in cache (docs/quantization.md); 12 leaves a margin.
inline constexpr int64_t kGemmInt8SmallMMax = 12;

// y[i * ldy + j] for i < m, j < w.n_out as above. xq: [m, w.n_in] int8, row stride ldx;
// x_scales[m].
// REQUIRES: ldx >= w.n_in, ldy >= w.n_out, w.ld >= w.n_in, w.n_in <= kGemmInt8MaxK, y does not
// alias the inputs. m == 0 is a no-op; n_in == 0 writes zeros.
void GemmInt8(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx,
              const Int8WeightView& w, float* y, int64_t ldy, ThreadPool* pool);

// The raw int32 accumulators acc[i * ldacc + j] (no scales used; w.scales may be null). Used
// where the integer result itself is wanted (tests, INT8 indexer scores).
void GemmInt8Acc(const int8_t* xq, int64_t m, int64_t ldx, const Int8WeightView& w,
                 int32_t* acc, int64_t ldacc, ThreadPool* pool);

// One GEMM of a grouped call: its own weights, rows of x (with their scales) and output.
// Groups are independent: they may share x (e.g. gate_proj and up_proj of one expert read the
// same rows: put such groups next to each other and they share one widened copy) but not y.
// m == 0 (an expert no token was routed to) is allowed and skipped.
struct Int8GemmGroup {
  Int8WeightView w;
  const int8_t* xq = nullptr;
  const float* x_scales = nullptr;
  int64_t m = 0;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

// Runs every group's GemmInt8 inside one parallel region: the (group, row block, column block)
// tasks of all groups are handed out together, so many small experts (a few rows each) keep
// every thread busy without one fork/join per expert. Each output equals what GemmInt8 writes.
// REQUIRES: each group meets GemmInt8's requirements; distinct groups' y do not overlap.
void GroupedGemmInt8(const Int8GemmGroup* groups, int64_t n_groups, ThreadPool* pool);

// Exact int8 dot product of length n (REQUIRES n <= kGemmInt8MaxK): the building block of INT8
// indexer scores (A8C8) and INT8 latent-cache attention (C8).
int32_t DotInt8(const int8_t* a, const int8_t* b, int64_t n);

}  // namespace pdserve::kernels
