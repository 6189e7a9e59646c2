// `pdserve version`: prints the build's version and ISA.
#include <cstdio>

#include "services/cli/command.h"

namespace pdserve::cli {
namespace {
int RunVersion(const CommandLine&) {
  std::printf("pdserve 0.1.0 (x86-64 AVX2+FMA+F16C)\n");
  return 0;
}
}  // namespace
PDSERVE_REGISTER_COMMAND(version, "version", "print the version", "", "Prints the version and the instruction set in use.", {},
                         0, RunVersion);
}  // namespace pdserve::cli
