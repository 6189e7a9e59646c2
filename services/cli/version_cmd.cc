// `pdserve version`: prints the build's version and ISA.
#include <cstdio>

#include "services/cli/command.h"

namespace pdserve::cli {
namespace {
int RunVersion(const std::vector<std::string>&) {
  std::printf("pdserve 0.1.0 (x86-64 AVX2+FMA+F16C)\n");
  return 0;
}
}  // namespace
PDSERVE_REGISTER_COMMAND(version, "version", "print the version", RunVersion);
}  // namespace pdserve::cli
