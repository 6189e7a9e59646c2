// A forward step's large activation arrays (a 512-token prefill chunk's are megabytes): buffers
// that skip the zero fill when every element is written before it is read, and the elementwise
// kernels split across the pool. Elementwise: an element's result never depends on the split,
// so a row's numbers stay those of the one-thread call (batch invariance holds).
#ifndef PDSERVE_MODEL_STEP_SCRATCH_H_
#define PDSERVE_MODEL_STEP_SCRATCH_H_

#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "common/aligned_vector.h"
#include "common/thread_pool.h"

namespace pdserve::model {

// An allocator whose value-less construct() default-initializes: vector<float>(n) then leaves
// the floats unset instead of writing n zeros (a page-faulting memset per step otherwise).
// Storage starts on a cache line (common/aligned_vector.h).
template <typename T>
struct DefaultInitAllocator : CacheLineAllocator<T> {
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using CacheLineAllocator<T>::CacheLineAllocator;
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// A vector whose sized constructor and resize leave new elements uninitialized: only for
// buffers every element of which is written before it is read.
template <typename T>
using ScratchVector = std::vector<T, DefaultInitAllocator<T>>;

// Split across `pool` when n is large enough to pay for a parallel region (inline otherwise,
// or without a pool):
// kernels::RoundToBf16InPlace over [0, n);
void RoundToBf16InPlace(float* x, int64_t n, ThreadPool* pool);
// the MLP activation from the gate and up projections, in one pass over both: gate and up
// rounded to bf16, then gate = kernels::SiluMulBf16(gate, up) (up is left rounded).
void GateUpToBf16Activation(float* gate, float* up, int64_t n, ThreadPool* pool);

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_STEP_SCRATCH_H_
