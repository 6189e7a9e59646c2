// `pdserve version`: prints the build's version, its baseline ISA and the kernels' ISA level.
#include <cstdio>

#include "kernels/isa.h"
#include "services/cli/command.h"

namespace pdserve::cli {
namespace {
int RunVersion(const CommandLine&) {
  const kernels::Isa isa = kernels::ActiveIsa();
  std::printf("pdserve 0.1.0 (x86-64 AVX2+FMA+F16C; kernels: %s, %s; detected %s)\n",
              kernels::IsaName(isa), kernels::IsaFeatures(isa),
              kernels::IsaName(kernels::DetectedIsa()));
  return 0;
}
}  // namespace
PDSERVE_REGISTER_COMMAND(version, "version", "print the version", "", "Prints the version and the instruction set in use.", {},
                         0, RunVersion);
}  // namespace pdserve::cli
