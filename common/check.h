// PDSERVE_CHECK: a broken invariant (a bug) aborts with a message; never used for bad input,
// which gets a Status. PDSERVE_DCHECK compiles away in release builds (kernel REQUIRES).
#pragma once

#include <string_view>

namespace pdserve::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, std::string_view msg);
}

#define PDSERVE_CHECK(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond)) [[unlikely]]                                                             \
      ::pdserve::internal::CheckFailed(__FILE__, __LINE__, #cond, ::std::string_view{__VA_ARGS__}); \
  } while (0)

#ifdef NDEBUG
#define PDSERVE_DCHECK(cond, ...) \
  do {                            \
  } while (0)
#else
#define PDSERVE_DCHECK(cond, ...) PDSERVE_CHECK(cond, __VA_ARGS__)
#endif
