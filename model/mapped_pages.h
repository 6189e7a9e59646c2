// Dropping consumed pages of a read-only checkpoint mapping (madvise MADV_DONTNEED), in one
// place for the loader (model/weights.cc: FP8 bytes once dequantized) and the converter
// (model/tools/convert.cc: every input tensor once written).
//
// The range dropped is [p, p + n) widened to 64 KiB-aligned windows: touching one page makes
// the kernel map its in-cache neighbours in such a window ("fault-around"), and those would
// otherwise stay resident -- with the ~45K small scale_inv tensors of a real FP8 checkpoint,
// gigabytes. Dropping too much of a file mapping is harmless (read-only and private: a later
// touch maps the page again), but the range must never leave it: MADV_DONTNEED on neighbouring
// anonymous memory zeroes it. Hence the clamp to a PageSpan known to lie inside the mapping.
// Thread-safety: pure functions (madvise on pages the caller no longer reads).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace pdserve::model {

// Page-aligned addresses [lo, hi); empty when hi <= lo.
struct PageSpan {
  uintptr_t lo = ~uintptr_t{0}, hi = 0;
};

// The pages wholly inside [p, p + n) (rounded inward: always inside the bytes' mapping).
PageSpan PagesInside(const void* p, size_t n);
// The pages touching [p, p + n) (rounded outward: inside a file mapping that starts at the
// file's first byte, since a mapping ends on a page boundary).
PageSpan PagesAround(const void* p, size_t n);
// Widens *span to cover `more`.
void Extend(PageSpan* span, const PageSpan& more);

// Drops this process's pages around [p, p + n) as described above, clamped to `bound`.
void DropPages(const void* p, size_t n, const PageSpan& bound);

// Maps the pages of [p, p + n) (a read-only file mapping) in one call (MADV_POPULATE_READ)
// rather than a fault per page on first read. Best effort: older kernels ignore it.
void PrefaultPages(const void* p, size_t n);

// Anonymous read-write memory whose pages are all mapped up front (MADV_POPULATE_WRITE): one call
// instead of a page fault per 4 KiB on first touch (~10 us each in some VMs; 1.7 s against
// 0.09 s for 512 MiB measured here). Aligned to, and a multiple of, 2 MiB, and advised as
// huge-page memory (MADV_HUGEPAGE): weights read once per step or per request then cost a TLB
// entry per 2 MiB instead of per 4 KiB. On a VM with shadow page tables a 4 KiB weight page
// that went unread for a while costs a hypervisor exit on its next read; a prefill worker,
// whose lm_head and experts go cold between requests, spent 400-900 ms of a 32-token
// prefill on that (docs/engine.md "Huge pages for the weights"). Unmapped in the destructor.
// Move-only.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

class PopulatedPages {
 public:
  PopulatedPages() = default;
  // Errors: ResourceExhausted when the mapping fails (out of memory or address space).
  static Result<PopulatedPages> Map(size_t bytes);
  PopulatedPages(PopulatedPages&& other) noexcept;
  PopulatedPages& operator=(PopulatedPages&& other) noexcept;
  ~PopulatedPages();
  void* data() const { return data_; }
  size_t size() const { return size_; }  // bytes asked for, rounded up to 2 MiB
  // Whether the kernel took the huge-page advice (THP "never" refuses it).
  bool huge_advised() const { return huge_; }
  // The bytes of this mapping the kernel backs with huge pages now (/proc/self/smaps), for logs
  // and tests; 0 when unknown.
  size_t HugeBytes() const;

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  bool huge_ = false;
};

}  // namespace pdserve::model
