// Linear: one weight matrix of the model ([n_out, n_in], y = x W^T) and the single entry point
// every projection goes through, so the weight format (BF16, F32, or INT8 W8A8) is chosen in
// one place.
//
// W8A8 (int8 set): weights int8 [n_out, n_in] with one fp32 scale per output row, usually a view
// into the mmap'd checkpoint (owned_i8/owned_scales hold them otherwise). ApplyLinear then
// quantizes each activation row on the fly (per token: scale = amax/127, codes = round(x/scale),
// kernels/quantize.h), runs the exact int8 x int8 -> int32 GEMM and rescales once:
// y = (acc * x_scale[i]) * w_scale[j] (kernels/gemm_int8.h).
// Thread-safety: immutable after loading; ApplyLinear may run concurrently on distinct outputs
// (its activation scratch is thread-local).
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int8.h"

namespace pdserve::model {

struct Linear {
  kernels::WeightView view{};        // BF16/F32 weights (into the mmap or owned_bf16), row-major
  std::vector<uint16_t> owned_bf16;  // storage when the view is not into the checkpoint
  // The same BF16 weights prepacked for the GEMM kernels (kernels/gemm.h kPanels16), made at
  // load (PackForGemm); when present, ApplyLinear reads these and `view` only describes the
  // shape (its data is null when the row-major copy was owned and has been freed).
  kernels::PackedBf16Weights packed;
  kernels::Int8WeightView int8{};    // W8A8 weights; int8.data != nullptr selects this format
  std::vector<int8_t> owned_i8;      // storage when int8 is not a view into the checkpoint
  std::vector<float> owned_scales;
  bool is_int8() const { return int8.data != nullptr; }
  int64_t n_out() const { return is_int8() ? int8.n_out : view.n_out; }
  int64_t n_in() const { return is_int8() ? int8.n_in : view.n_in; }
  // The weights the GEMM entry points get: the packed panels when made, else the view.
  kernels::WeightView gemm_view() const { return packed ? packed.view() : view; }
};

// Prepacks a BF16 Linear's weights (kernels::PackedBf16Weights) so its GEMMs read each weight
// once, in order, with no per-call transposes: the decode GEMV then runs at memory speed.
// Results are bitwise unchanged (every layout keeps the kernels' one summation order).
// Frees owned row-major storage (owned_bf16) once packed. No-op for F32, INT8 or empty weights.
// With dst (kernels::Bf16PanelBytes bytes, 64-byte aligned, kept alive by the caller) the
// panels go there; without, into memory the Linear owns.
void PackForGemm(Linear* w, void* dst, ThreadPool* pool);

// y[m, n_out] = x[m, n_in] W^T (rows packed: ldx = n_in, ldy = n_out). BF16/F32: fp32
// accumulation (kernels/gemm.h). INT8: dynamic per-token activation quantization, exact int32
// accumulation, fp32 rescale.
void ApplyLinear(const Linear& w, const float* x, int64_t m, float* y, ThreadPool* pool);

// One projection of a grouped call: y[m, n_out] = x[m, n_in] W^T (rows packed).
struct LinearCall {
  const Linear* w = nullptr;
  const float* x = nullptr;
  int64_t m = 0;  // 0 allowed (an expert no token was routed to): nothing is written
  float* y = nullptr;
};

// Runs every call, each y bitwise equal to ApplyLinear's, in two parallel regions at most
// instead of a fork/join each -- the MoE experts of a layer: the INT8 calls share one
// (kernels::GroupedGemmInt8; list gate and up of each expert next to each other with the same
// x, so its rows are quantized once), the BF16/F32 calls another (tasks over (call, block of
// outputs), each kernels::GemmRows on one thread). Call again for the down projections.
// REQUIRES: distinct calls' y do not overlap, and no y aliases any x.
void ApplyLinearGrouped(const LinearCall* calls, int64_t n, ThreadPool* pool);

// An INT8 Linear owning its storage, quantized per output row from fp32 weights w[n_out, n_in]
// (the converter's per-channel scheme). For tests and tools; checkpoints are converted offline.
Linear QuantizeToInt8Linear(const float* w, int64_t n_out, int64_t n_in);

}  // namespace pdserve::model
