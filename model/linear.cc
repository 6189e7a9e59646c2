#include "model/linear.h"

#include <algorithm>

#include "kernels/quantize.h"

namespace pdserve::model {

namespace {
// Below this many activation values one thread quantizes them faster than a pool hand-off.
constexpr int64_t kParallelQuantizeMin = 1 << 16;
// Grouped BF16/F32 calls: each call's outputs go in about this many blocks of at least this
// many outputs (a block streams its weight rows once for all of the call's rows).
constexpr int64_t kFloatBlocksPerCall = 4, kFloatBlockMin = 128;
struct FloatTask {
  int64_t call, j0, j1;
};
}  // namespace

void ApplyLinear(const Linear& w, const float* x, int64_t m, float* y, ThreadPool* pool) {
  if (!w.is_int8()) {
    kernels::Gemm(x, m, w.n_in(), w.gemm_view(), y, w.n_out(), pool);
    return;
  }
  const int64_t n_in = w.n_in();
  // Grow-only per-thread scratch: the quantized activations of this call.
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  if (xq.size() < static_cast<size_t>(m * n_in)) xq.resize(static_cast<size_t>(m * n_in));
  if (xs.size() < static_cast<size_t>(m)) xs.resize(static_cast<size_t>(m));
  int8_t* q = xq.data();
  float* s = xs.data();
  if (pool != nullptr && m > 1 && m * n_in >= kParallelQuantizeMin) {
    pool->ParallelFor(m, [=](int64_t b, int64_t e) {
      kernels::QuantizeRowsInt8(x + b * n_in, e - b, n_in, n_in, q + b * n_in, n_in, s + b);
    });
  } else {
    kernels::QuantizeRowsInt8(x, m, n_in, n_in, q, n_in, s);
  }
  kernels::GemmInt8(q, s, m, n_in, w.int8, y, w.n_out(), pool);
}

void ApplyLinearGrouped(const LinearCall* calls, int64_t n, ThreadPool* pool) {
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<float> xs;
  thread_local std::vector<int64_t> offset;  // per call: its rows' start in xq (in rows of xs)
  thread_local std::vector<int64_t> q_offset;
  thread_local std::vector<kernels::Int8GemmGroup> groups;
  offset.assign(static_cast<size_t>(n), -1);
  q_offset.assign(static_cast<size_t>(n), -1);
  int64_t rows = 0, bytes = 0;
  for (int64_t i = 0; i < n; ++i) {
    const LinearCall& c = calls[i];
    if (!c.w->is_int8() || c.m <= 0) continue;
    const LinearCall* prev = i > 0 ? &calls[i - 1] : nullptr;
    if (prev && offset[i - 1] >= 0 && prev->x == c.x && prev->m == c.m && prev->w->n_in() == c.w->n_in()) {
      offset[i] = offset[i - 1];
      q_offset[i] = q_offset[i - 1];
      continue;
    }
    offset[i] = rows;
    q_offset[i] = bytes;
    rows += c.m;
    bytes += c.m * c.w->n_in();
  }
  if (xq.size() < static_cast<size_t>(bytes)) xq.resize(static_cast<size_t>(bytes));
  if (xs.size() < static_cast<size_t>(rows)) xs.resize(static_cast<size_t>(rows));
  // Quantize each distinct activation block once (rows are independent, so any split of the
  // rows gives the same codes): in parallel over all rows when there are enough values.
  thread_local std::vector<int64_t> quant_calls, quant_row0;  // calls that quantize; first row of each
  quant_calls.clear();
  quant_row0.clear();
  for (int64_t i = 0; i < n; ++i)
    if (offset[i] >= 0 && (i == 0 || offset[i] != offset[i - 1])) {
      quant_calls.push_back(i);
      quant_row0.push_back(offset[i]);
    }
  // Workers see their own thread_local instances: the lambda uses only these plain locals.
  const std::vector<int64_t>& qcalls = quant_calls;
  const std::vector<int64_t>& qrow0 = quant_row0;
  const int64_t* qoff = q_offset.data();
  int8_t* const q_base = xq.data();
  float* const s_base = xs.data();
  auto quantize_rows = [&](int64_t row_begin, int64_t row_end) {
    // The quantizing calls hold consecutive row ranges [offset, offset + m) in list order.
    size_t t = static_cast<size_t>(std::upper_bound(qrow0.begin(), qrow0.end(), row_begin) - qrow0.begin() - 1);
    for (; t < qcalls.size() && qrow0[t] < row_end; ++t) {
      const LinearCall& c = calls[qcalls[t]];
      const int64_t n_in = c.w->n_in(), first = qrow0[t];
      const int64_t b = std::max(row_begin, first), e = std::min(row_end, first + c.m);
      kernels::QuantizeRowsInt8(c.x + (b - first) * n_in, e - b, n_in, n_in, q_base + qoff[qcalls[t]] + (b - first) * n_in,
                                n_in, s_base + b);
    }
  };
  if (pool != nullptr && rows > 1 && bytes >= kParallelQuantizeMin)
    pool->ParallelFor(rows, quantize_rows);
  else if (rows > 0)
    quantize_rows(0, rows);
  groups.clear();
  thread_local std::vector<FloatTask> float_tasks;
  float_tasks.clear();
  for (int64_t i = 0; i < n; ++i) {
    const LinearCall& c = calls[i];
    if (c.m <= 0) continue;
    if (!c.w->is_int8()) {
      // Output blocks of whole cache lines of weight rows; small enough that a layer's experts
      // give every thread several tasks.
      const int64_t n_out = c.w->n_out();
      // Blocks start on multiples of 16: packed weights (kPanels16) are sliced on panels.
      const int64_t block = std::max<int64_t>(kFloatBlockMin, (n_out + 16 * kFloatBlocksPerCall - 1) /
                                                                  (16 * kFloatBlocksPerCall) * 16);
      for (int64_t j = 0; j < n_out; j += block) float_tasks.push_back({i, j, std::min(n_out, j + block)});
      continue;
    }
    const int64_t n_in = c.w->n_in();
    groups.push_back({c.w->int8, xq.data() + q_offset[i], xs.data() + offset[i], c.m, n_in, c.y, c.w->n_out()});
  }
  if (!float_tasks.empty()) {
    // Every BF16/F32 call's output blocks in one parallel region; each block is GemmRows on
    // the calling thread, so each value is bitwise what ApplyLinear (Gemm) writes there.
    // Claimed one at a time, the costliest first (rows x outputs x inputs): ParallelFor's
    // n_threads * 4 contiguous chunks left one thread finishing a chunk of big tasks (a prefill
    // chunk's shared expert has 8x the rows of a routed one) while the other waited.
    std::stable_sort(float_tasks.begin(), float_tasks.end(), [&](const FloatTask& a, const FloatTask& b) {
      const LinearCall &ca = calls[a.call], &cb = calls[b.call];
      return ca.m * (a.j1 - a.j0) * ca.w->n_in() > cb.m * (b.j1 - b.j0) * cb.w->n_in();
    });
    const std::vector<FloatTask>& tasks = float_tasks;
    auto run = [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const LinearCall& c = calls[tasks[static_cast<size_t>(t)].call];
        kernels::GemmRows(c.x, c.m, c.w->n_in(), c.w->gemm_view(), tasks[static_cast<size_t>(t)].j0,
                          tasks[static_cast<size_t>(t)].j1, c.y, c.w->n_out(), nullptr);
      }
    };
    if (pool != nullptr) pool->ParallelForChunks(static_cast<int64_t>(tasks.size()), 1, run);
    else run(0, static_cast<int64_t>(tasks.size()));
  }
  kernels::GroupedGemmInt8(groups.data(), static_cast<int64_t>(groups.size()), pool);
}

void PackForGemm(Linear* w, void* dst, ThreadPool* pool) {
  if (w->is_int8() || w->packed || w->view.dtype != DType::kBF16 || w->view.data == nullptr ||
      w->view.n_out <= 0 || w->view.n_in <= 0)
    return;
  w->packed = dst != nullptr ? kernels::PackedBf16Weights::PackInto(w->view, dst, pool)
                             : kernels::PackedBf16Weights::Pack(w->view, pool);
  if (!w->owned_bf16.empty()) {
    std::vector<uint16_t>().swap(w->owned_bf16);
    w->view.data = nullptr;
  }
}

Linear QuantizeToInt8Linear(const float* w, int64_t n_out, int64_t n_in) {
  Linear l;
  l.owned_i8.resize(static_cast<size_t>(n_out * n_in));
  l.owned_scales.resize(static_cast<size_t>(n_out));
  kernels::QuantizeRowsInt8(w, n_out, n_in, n_in, l.owned_i8.data(), n_in, l.owned_scales.data());
  l.int8 = {l.owned_i8.data(), l.owned_scales.data(), n_out, n_in, n_in};
  return l;
}

}  // namespace pdserve::model
