#include "model/mapped_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
  // Reserve a huge page more than asked, to start on a huge-page boundary, then give back the
  // ends: the kernel backs a range with 2 MiB pages only where it is so aligned.
  const size_t size = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const size_t reserve = size + kHugePageBytes;
  void* raw = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    return Status::ResourceExhausted("cannot map " + std::to_string(bytes >> 20) + " MiB of memory for packed weights");
  const uintptr_t lo = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (lo + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  if (start > lo) munmap(raw, start - lo);
  if (const uintptr_t end = lo + reserve; end > start + size) munmap(reinterpret_cast<void*>(start + size), end - (start + size));
  pages.data_ = reinterpret_cast<void*>(start);
  pages.size_ = size;
  // Huge pages where the kernel allows them (THP "madvise" or "always"); 4 KiB pages otherwise.
  pages.huge_ = madvise(pages.data_, size, MADV_HUGEPAGE) == 0;
  bool populated = false;
#ifdef MADV_POPULATE_WRITE
  populated = madvise(pages.data_, size, MADV_POPULATE_WRITE) == 0;
  // Out of memory is an error here, not a crash later; EINVAL is a kernel without the advice.
  if (!populated && errno != EINVAL)
    return Status::ResourceExhausted("cannot populate " + std::to_string(size >> 20) + " MiB for packed weights: " +
                                     std::strerror(errno));
#endif
  if (!populated) {
    // Older kernels: one write per page does what MADV_POPULATE_WRITE does, fault by fault.
    const uintptr_t page = PageSize();
    for (uintptr_t a = start; a < start + size; a += page) *reinterpret_cast<volatile char*>(a) = 0;
  }
  return pages;
}

size_t PopulatedPages::HugeBytes() const {
  if (data_ == nullptr) return 0;
  // Sum AnonHugePages over this mapping's smaps entries (the kernel may split it in several).
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return 0;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data_), hi = lo + size_;
  size_t huge_kib = 0;
  bool inside = false;
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long a = 0, b = 0;
    if (std::sscanf(line, "%lx-%lx ", &a, &b) == 2) {
      inside = a >= lo && b <= hi;
      continue;
    }
    size_t kib = 0;
    if (inside && std::sscanf(line, "AnonHugePages: %zu kB", &kib) == 1) huge_kib += kib;
  }
  std::fclose(f);
  return huge_kib << 10;
}

PopulatedPages::PopulatedPages(PopulatedPages&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), huge_(other.huge_) {}

PopulatedPages& PopulatedPages::operator=(PopulatedPages&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    huge_ = other.huge_;
  }
  return *this;
}

PopulatedPages::~PopulatedPages() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace pdserve::model
