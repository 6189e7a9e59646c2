// Dense GEMM / GEMV against read-only weight matrices: y = x W^T (the Hugging Face Linear layout).
//
// One kernel family per ISA level (kernels/isa.h; chosen once per process), all with ONE
// summation order: every output is a single sequential fp32 FMA chain over k = 0 .. n_in-1,
// starting from +0. So a row's result is bitwise the same whether it is computed alone (m = 1,
// decode) or with any other rows (a decode batch, a prefill chunk), on any level, thread
// count, slice (GemmRows), stride or weight layout; the tiled kernels serve decode batches too
// and callers need not group rows to keep a request's numbers independent of its batch.
// See docs/kernels-gemm.md for the design, why this order, and measured figures.
//
// Weights come in two layouts (WeightView::layout):
//   * kRows: the checkpoint's own [n_out, n_in] row-major layout, any row stride (it may be an
//     mmap'd checkpoint): kernels never modify it and never copy it whole; they transpose
//     blocks of it on the fly, which costs shuffle-port work per weight on every call.
//   * kPanels16 (BF16 only): the same values prepacked once at load (PackedBf16Weights) as
//     panels of 16 outputs x k pairs, so that the kernels read each weight once, in order,
//     with no transposes: the decode GEMV streams at memory speed.
//
// Numerics: products of x and the bf16/fp32 weights are exact in fp32 FMA, sums are fp32.
//
// Threading: work is split through ThreadPool::ParallelFor (the calling thread takes part);
// pool == nullptr runs on the calling thread. Kernels never start threads, never log, and never
// allocate per call except for growing reused thread-local scratch the first times (on the
// calling thread: the prepared x, at most 16 MiB per wave; larger calls go in row chunks).
// Safe to call concurrently from several threads with different pools (or none).
#pragma once

#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "common/thread_pool.h"

namespace pdserve::kernels {

enum class WeightLayout : uint8_t {
  kRows,      // row-major [n_out, n_in] with row stride ld
  kPanels16,  // BF16 panels (below); ld unused
};

// The kPanels16 layout: panel p = outputs [16p, 16p + 16) (rows past n_out are zero), then per
// k pair q (k = 2q, 2q + 1; k = n_in is zero when n_in is odd) 16 dwords, lane t holding
// bf16 W[16p + t][2q] in its low half and W[16p + t][2q + 1] in its high half. Each panel is
// contiguous: ceil(n_in / 2) * 64 bytes. The data is 64-byte aligned.
int64_t Bf16PanelBytes(int64_t n_out, int64_t n_in);

// A read-only weight matrix W of shape [n_out, n_in] (the Hugging Face Linear layout:
// y = x W^T), stored as F32 or BF16 row-major with row stride ld (elements, >= n_in), or as
// BF16 panels (layout kPanels16, see above).
// Row-major data may live in an mmap'd checkpoint: kernels never modify or copy the whole matrix.
struct WeightView {
  DType dtype;  // DType::kF32 or DType::kBF16 (kBF16 for kPanels16)
  const void* data;
  int64_t n_out;
  int64_t n_in;
  int64_t ld;  // elements between consecutive rows (kRows)
  WeightLayout layout = WeightLayout::kRows;
};

// A BF16 matrix prepacked as kPanels16 panels, in memory it owns (Pack) or in the caller's
// (PackInto: e.g. one populated arena for a whole model, since a page fault per 4 KiB of fresh
// memory costs ~10 us in some VMs). Move-only; empty when default-made.
class PackedBf16Weights {
 public:
  PackedBf16Weights() = default;
  // Packs `rows` (BF16, layout kRows, any ld) into owned memory. On the pool when given.
  static PackedBf16Weights Pack(const WeightView& rows, ThreadPool* pool);
  // Packs into dst: Bf16PanelBytes(rows.n_out, rows.n_in) bytes, 64-byte aligned, owned by the
  // caller and kept alive (unchanged) as long as the result is used.
  static PackedBf16Weights PackInto(const WeightView& rows, void* dst, ThreadPool* pool);
  explicit operator bool() const { return data_ != nullptr; }
  // The packed matrix (REQUIRES: non-empty).
  WeightView view() const;
  int64_t bytes() const { return Bf16PanelBytes(n_out_, n_in_); }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  const void* data_ = nullptr;
  std::unique_ptr<void, Free> owned_;
  int64_t n_out_ = 0, n_in_ = 0;
};

// Rows per call some callers (model/) still cut their batches into. Results no longer depend on
// m at all (see above), so this only bounds those callers' scratch; it selects nothing here.
inline constexpr int64_t kGemmSmallMMax = 8;

// y[i, j] = sum_k x[i, k] * W[j, k]   for i < m, j < w.n_out   (fp32 accumulation)
// x: [m, w.n_in] fp32 with row stride ldx; y: [m, w.n_out] fp32 with row stride ldy.
// REQUIRES: ldx >= w.n_in, ldy >= w.n_out, y does not alias x (nor W). m may be 0 (no-op).
// w.n_in == 0 writes zeros. w.dtype is kF32 or kBF16 (anything else aborts); kPanels16 is BF16.
// Runs on `pool` (its calling thread included); pool == nullptr runs on the calling thread.
void Gemm(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy,
          ThreadPool* pool);

// Same with a slice of W's rows: only outputs j in [j_begin, j_end) are computed and written,
// at their usual places y[i * ldy + j] (y still points at output column 0). Each written value
// is bitwise equal to what Gemm writes there.
// REQUIRES: 0 <= j_begin <= j_end <= w.n_out, ldy >= j_end, plus Gemm's requirements; for
// kPanels16 weights j_begin is a multiple of 16 (a panel boundary).
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
