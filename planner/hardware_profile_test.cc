// HardwareProfile: every built-in profile parses and names its sources; bad YAML gets an error
// naming the key. To add a case: a YAML snippet and the error text it must produce.
#include "planner/hardware_profile.h"

#include <gtest/gtest.h>

namespace pdserve::planner {
namespace {

const char* kMinimal = R"(
name: t
device: {memory_gib: 8, memory_bandwidth_gbs: 100, matmul_tflops: {bf16: 10}, attention_tflops: 1, indexer_tflops: 2}
node: {devices: 4, intra: {bandwidth_gbs: 10, latency_us: 2}, inter: {bandwidth_gbs: 1, latency_us: 20}}
kv_transfer: {bandwidth_gbs: 5, latency_us: 100}
)";

TEST(HardwareProfileTest, EveryBuiltinProfileParsesAndNamesItsSources) {
  const auto names = BuiltinProfileNames();
  ASSERT_GE(names.size(), 6u);
  for (const char* want : {"local", "h100", "h800", "h20", "ascend-910b", "ascend-a3"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const auto& n : names) {
    auto p = HardwareProfile::Load(n);
    ASSERT_TRUE(p.ok()) << n << ": " << p.status().ToString();
    EXPECT_EQ(p->name, n);
    EXPECT_FALSE(p->sources.empty()) << n;
    EXPECT_GT(p->memory_bytes, 0);
    EXPECT_GT(p->GemmFlops(MathType::kBf16, 512), 0);
  }
}

TEST(HardwareProfileTest, UnitsAndEfficiency) {
  auto p = HardwareProfile::Parse(kMinimal, "t");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_DOUBLE_EQ(p->memory_bytes, 8.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(p->memory_bandwidth_bps, 100e9);
  EXPECT_DOUBLE_EQ(p->GemmFlops(MathType::kBf16, 1), 10e12);  // no gemv rate: the matmul rate
  EXPECT_DOUBLE_EQ(p->intra.latency_s, 2e-6);
  EXPECT_EQ(&p->LinkFor(4), &p->intra);
  EXPECT_EQ(&p->LinkFor(5), &p->inter);
  auto h = HardwareProfile::Load("h800");
  ASSERT_TRUE(h.ok());
  // 989 TFLOPS peak x 0.6, 3350 GB/s x 0.8.
  EXPECT_NEAR(h->GemmFlops(MathType::kBf16, 4096), 989e12 * 0.6, 1e9);
  EXPECT_NEAR(h->memory_bandwidth_bps, 3350e9 * 0.8, 1e6);
  EXPECT_FALSE(HardwareProfile::Load("ascend-910b")->HasMath(MathType::kFp8));
  // Rates by row count: interpolated in log m, toward the large-m rate at 4x the last point.
  auto r = HardwareProfile::Parse(std::string(kMinimal).replace(
                                      std::string(kMinimal).find("matmul_tflops: {bf16: 10}"), 25,
                                      "matmul_tflops: {bf16: 10}, gemv_tflops: {bf16: 2}, "
                                      "matmul_tflops_by_rows: {bf16: {16: 4, 64: 8}}"),
                                  "r");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->GemmFlops(MathType::kBf16, 8), 2e12);    // gemv
  EXPECT_DOUBLE_EQ(r->GemmFlops(MathType::kBf16, 12), 4e12);   // clamped to the first point
  EXPECT_NEAR(r->GemmFlops(MathType::kBf16, 32), 6e12, 1e3);   // halfway in log m
  EXPECT_NEAR(r->GemmFlops(MathType::kBf16, 128), 9e12, 1e3);  // halfway to the peak at 256
  EXPECT_DOUBLE_EQ(r->GemmFlops(MathType::kBf16, 4096), 10e12);
}

TEST(HardwareProfileTest, BadInputNamesTheKey) {
  struct Case {
    std::string yaml, error;
  };
  const std::string base = kMinimal;
  const std::vector<Case> cases = {
      {"[1, 2]", "must be a YAML mapping"},
      {"name: t\n", "device: missing"},
      {base + "colour: red\n", "colour: unknown key"},
      {"name: t\ndevice: {memory_gib: -1}\n", "device.memory_gib"},
      {"name: t\ndevice: {memory_gib: 8, memory_bandwidth_gbs: x}\n", "device.memory_bandwidth_gbs: expected a number"},
      {"name: t\ndevice: {memory_gib: 8, memory_bandwidth_gbs: 1, attention_tflops: 1, indexer_tflops: 1, "
       "matmul_tflops: {fp4: 3}}\n",
       "unknown data type 'fp4'"},
      {"name: t\ndevice: {memory_gib: 8, memory_bandwidth_gbs: 1, attention_tflops: 1, indexer_tflops: 1, "
       "matmul_tflops: {int8: 3}}\n",
       "matmul_tflops.bf16: missing"},
      {base + "engine: {first_chunk_attention: sideways}\n", "expected absorbed or expanded"},
      {"name: t\ndevice: {efficiency: {matmul: 1.5}}\n", "factors must be in (0, 1]"},
      {"name: [\n", "not valid YAML"},
  };
  for (const auto& c : cases) {
    auto p = HardwareProfile::Parse(c.yaml, "case");
    ASSERT_FALSE(p.ok()) << c.yaml;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_NE(p.status().message().find(c.error), std::string::npos) << p.status().ToString() << " wants " << c.error;
  }
  auto missing = HardwareProfile::Load("no-such-profile");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("local"), std::string::npos);  // lists the built-ins
}

}  // namespace
}  // namespace pdserve::planner
