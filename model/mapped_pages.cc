#include "model/mapped_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace pdserve::model {

namespace {
uintptr_t PageSize() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}
}  // namespace

PageSpan PagesInside(const void* p, size_t n) {
  const uintptr_t page = PageSize(), a = reinterpret_cast<uintptr_t>(p);
  return {(a + page - 1) & ~(page - 1), (a + n) & ~(page - 1)};
}

PageSpan PagesAround(const void* p, size_t n) {
  const uintptr_t page = PageSize(), a = reinterpret_cast<uintptr_t>(p);
  return {a & ~(page - 1), (a + n + page - 1) & ~(page - 1)};
}

void Extend(PageSpan* span, const PageSpan& more) {
  span->lo = std::min(span->lo, more.lo);
  span->hi = std::max(span->hi, more.hi);
}

void DropPages(const void* p, size_t n, const PageSpan& bound) {
  constexpr uintptr_t kWindow = 64 << 10;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = std::max(a & ~(kWindow - 1), bound.lo);
  const uintptr_t end = std::min((a + n + kWindow - 1) & ~(kWindow - 1), bound.hi);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace pdserve::model
