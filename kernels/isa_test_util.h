// Test helper: run a check once per ISA level (kernels/isa.h). Levels this machine lacks are
// not run, and the test says so loudly on stderr and in the test's XML properties, so a green
// run on an AVX2-only CPU is never mistaken for a check of the AVX-512 or AMX kernels.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "kernels/isa.h"

namespace pdserve::kernels {

// Calls fn(isa) for every level <= DetectedIsa(); reports the others as not run.
template <typename Fn>
void ForEachIsa(Fn&& fn) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (isa > DetectedIsa()) {
      const std::string what = std::string("NOT RUN: ") + IsaName(isa) + " kernels (this machine lacks " +
                               MissingFeatures(isa) + ")";
      std::fprintf(stderr, "\n******** %s ********\n\n", what.c_str());
      ::testing::Test::RecordProperty(std::string("not_run_") + IsaName(isa), what);
      continue;
    }
    SCOPED_TRACE(std::string("isa=") + IsaName(isa));
    fn(isa);
  }
}

}  // namespace pdserve::kernels
