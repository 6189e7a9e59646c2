#include "model/step_scratch.h"

#include <algorithm>

#include "kernels/elementwise.h"

namespace pdserve::model {
namespace {

// Below this many elements (~10 us of rounding) a parallel region costs more than it saves.
constexpr int64_t kMinParallelElements = 1 << 15;
// Chunks of whole 4 KiB pages of floats: no two threads write one cache line.
constexpr int64_t kChunkElements = 1024;

template <typename Fn>
void SplitElements(int64_t n, ThreadPool* pool, const Fn& fn) {
  if (!pool || pool->n_threads() == 1 || n < kMinParallelElements) {
    fn(0, n);
    return;
  }
  const int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
  pool->ParallelFor(chunks, [&](int64_t b, int64_t e) {
    const int64_t begin = b * kChunkElements, end = std::min(n, e * kChunkElements);
    fn(begin, end);
  });
}

}  // namespace

void RoundToBf16InPlace(float* x, int64_t n, ThreadPool* pool) {
  SplitElements(n, pool, [&](int64_t b, int64_t e) { kernels::RoundToBf16InPlace(x + b, e - b); });
}

void GateUpToBf16Activation(float* gate, float* up, int64_t n, ThreadPool* pool) {
  SplitElements(n, pool, [&](int64_t b, int64_t e) {
    kernels::RoundToBf16InPlace(gate + b, e - b);
    kernels::RoundToBf16InPlace(up + b, e - b);
    kernels::SiluMulBf16(gate + b, up + b, e - b, gate + b);
  });
}

}  // namespace pdserve::model
