#include "model/mapped_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

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

void PrefaultPages(const void* p, size_t n) {
#ifdef MADV_POPULATE_READ
  const PageSpan span = PagesAround(p, n);
  if (span.hi > span.lo) madvise(reinterpret_cast<void*>(span.lo), span.hi - span.lo, MADV_POPULATE_READ);
#else
  (void)p;
  (void)n;
#endif
}

Result<PopulatedPages> PopulatedPages::Map(size_t bytes) {
  PopulatedPages pages;
  if (bytes == 0) return pages;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    return Status::ResourceExhausted("cannot map " + std::to_string(bytes >> 20) + " MiB of memory for packed weights");
  pages.data_ = p;
  pages.size_ = bytes;
  return pages;
}

PopulatedPages::PopulatedPages(PopulatedPages&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PopulatedPages& PopulatedPages::operator=(PopulatedPages&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PopulatedPages::~PopulatedPages() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace pdserve::model
