// Tests for kernels/isa.h: names, detection checked against the kernel's own view of the CPU
// (/proc/cpuinfo flags, an independent source), and the PDSERVE_ISA override, which is read
// once per process: each case runs this test binary again with the variable set.
#include "kernels/isa.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace pdserve::kernels {
namespace {

TEST(IsaTest, NamesRoundTrip) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    ASSERT_TRUE(ParseIsa(IsaName(isa)).has_value());
    EXPECT_EQ(*ParseIsa(IsaName(isa)), isa);
  }
  EXPECT_FALSE(ParseIsa("AVX2").has_value());
  EXPECT_FALSE(ParseIsa("avx512f").has_value());
  EXPECT_FALSE(ParseIsa("").has_value());
}

std::set<std::string> CpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) flags.insert(w);
    break;
  }
  return flags;
}

TEST(IsaTest, DetectionAgreesWithProcCpuinfo) {
  const std::set<std::string> f = CpuinfoFlags();
  ASSERT_FALSE(f.empty());
  const bool avx512 = f.count("avx512f") && f.count("avx512dq") && f.count("avx512bw") &&
                      f.count("avx512vl") && f.count("avx512_vnni");
  const bool amx = avx512 && f.count("amx_tile") && f.count("amx_int8") && f.count("amx_bf16");
  // /proc/cpuinfo lists what the kernel enabled (XCR0 included); the tile permission is granted
  // to any process that asks on such kernels.
  const Isa expect = amx ? Isa::kAmx : avx512 ? Isa::kAvx512 : Isa::kAvx2;
  EXPECT_EQ(DetectedIsa(), expect) << "detected " << IsaName(DetectedIsa());
  EXPECT_TRUE(MissingFeatures(DetectedIsa()).empty());
  if (DetectedIsa() != Isa::kAmx) {
    EXPECT_FALSE(MissingFeatures(Isa::kAmx).empty());
  }
  std::fprintf(stderr, "detected ISA level: %s (%s)\n", IsaName(DetectedIsa()), IsaFeatures(DetectedIsa()));
}

// Child mode: prints the selection (or its error) and exits; run through RunWithIsaEnv.
TEST(IsaTest, ChildPrintsSelection) {
  if (std::getenv("PDSERVE_ISA_TEST_CHILD") == nullptr) GTEST_SKIP() << "runs as a child only";
  const Result<Isa> r = SelectIsa();
  std::printf("SELECTED %s\n", r.ok() ? IsaName(*r) : r.status().ToString().c_str());
  std::fflush(stdout);
  std::_Exit(0);
}

// Runs this binary's child case with PDSERVE_ISA set (or unset); returns its "SELECTED" line.
std::string RunWithIsaEnv(const char* value) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "readlink failed";
  exe[n] = '\0';
  std::string cmd = "PDSERVE_ISA_TEST_CHILD=1 ";
  cmd += value ? std::string("PDSERVE_ISA='") + value + "' " : "env -u PDSERVE_ISA ";
  cmd += std::string(exe) + " --gtest_filter=IsaTest.ChildPrintsSelection 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "popen failed";
  std::string out;
  std::array<char, 512> buf;
  while (fgets(buf.data(), buf.size(), p)) {
    const std::string line = buf.data();
    if (line.rfind("SELECTED ", 0) == 0) out = line.substr(9, line.size() - 10);
  }
  pclose(p);
  return out;
}

TEST(IsaTest, EnvironmentForcesALowerLevel) {
  EXPECT_EQ(RunWithIsaEnv(nullptr), IsaName(DetectedIsa()));
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    const std::string got = RunWithIsaEnv(IsaName(isa));
    if (isa <= DetectedIsa()) {
      EXPECT_EQ(got, IsaName(isa));
    } else {
      // A level the machine lacks is a clear error naming what is missing.
      EXPECT_NE(got.find("InvalidArgument"), std::string::npos) << got;
      EXPECT_NE(got.find(std::string("PDSERVE_ISA=") + IsaName(isa)), std::string::npos) << got;
      EXPECT_NE(got.find("lacks"), std::string::npos) << got;
    }
  }
  const std::string bad = RunWithIsaEnv("avx1024");
  EXPECT_NE(bad.find("is not an ISA level"), std::string::npos) << bad;
}

}  // namespace
}  // namespace pdserve::kernels
