// Compiled without -mavx2 so it can run (and report) on any x86-64 CPU.
#include "common/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace pdserve {

Status CheckCpuFeatures() {
  __builtin_cpu_init();
  std::string missing;
  if (!__builtin_cpu_supports("avx2")) missing += " avx2";
  if (!__builtin_cpu_supports("fma")) missing += " fma";
  // F16C has no __builtin_cpu_supports name in every GCC; read CPUID leaf 1 ECX bit 29.
  unsigned eax, ebx, ecx, edx;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
  if (!(ecx & (1u << 29))) missing += " f16c";
  if (!missing.empty())
    return Status::FailedPrecondition("this CPU lacks required instruction sets:" + missing +
                                      " (pdserve is built for x86-64 with AVX2+FMA+F16C)");
  return Status::Ok();
}

void RequireCpuFeatures() {
  Status s = CheckCpuFeatures();
  if (!s.ok()) {
    std::fprintf(stderr, "pdserve: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace pdserve
