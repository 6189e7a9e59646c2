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

}  // namespace pdserve::model
