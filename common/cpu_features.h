// Start-up check that the CPU has the ISA the binaries were compiled for (AVX2, FMA, F16C).
// Every binary calls RequireCpuFeatures() first thing in main(), before any AVX2 code runs, so a
// machine without them gets a clear error instead of SIGILL.
#pragma once

#include "common/status.h"

namespace pdserve {

// Errors: FailedPrecondition naming the missing features.
Status CheckCpuFeatures();
// Prints the error and exits(1) when CheckCpuFeatures() fails.
void RequireCpuFeatures();

}  // namespace pdserve
