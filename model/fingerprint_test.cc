// WeightsFingerprint: equal for copies of one checkpoint, different for other weights with the
// same config, and a clear error for a damaged or missing checkpoint.
#include "model/fingerprint.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "model/tools/make_model.h"
#include "model/test_util.h"

namespace pdserve::model {
namespace {

namespace fs = std::filesystem;

std::string Make(const std::string& dir, uint64_t seed) {
  MakeModelOptions o;
  o.preset = "tiny";
  o.out_dir = dir;
  o.seed = seed;
  EXPECT_TRUE(MakeModel(o).ok());
  return dir;
}

TEST(WeightsFingerprintTest, SameWeightsAgreeOtherWeightsDiffer) {
  testing::TempDir tmp("fingerprint");
  const std::string a = Make(tmp.path() + "/a", 1);
  const std::string b = Make(tmp.path() + "/b", 2);  // same preset and config.json, other weights
  std::ifstream ca(a + "/config.json"), cb(b + "/config.json");
  ASSERT_EQ(std::string(std::istreambuf_iterator<char>(ca), {}), std::string(std::istreambuf_iterator<char>(cb), {}));
  fs::copy(a, tmp.path() + "/a-copy", fs::copy_options::recursive);
  auto fa = WeightsFingerprint(a), fb = WeightsFingerprint(b), fcopy = WeightsFingerprint(tmp.path() + "/a-copy");
  ASSERT_TRUE(fa.ok() && fb.ok() && fcopy.ok()) << fa.status().ToString();
  EXPECT_EQ(*fa, *fcopy);
  EXPECT_NE(*fa, *fb);
  EXPECT_EQ(*fa, *WeightsFingerprint(a));  // stable
}

TEST(WeightsFingerprintTest, OneChangedSampledByteChangesIt) {
  testing::TempDir tmp("fingerprint-flip");
  const std::string a = Make(tmp.path() + "/a", 1);
  const uint64_t before = WeightsFingerprint(a).value();
  // Flip the last byte of the largest shard: the last sampled window ends at the file's end.
  fs::path largest;
  for (const auto& e : fs::directory_iterator(a))
    if (e.path().extension() == ".safetensors" && (largest.empty() || e.file_size() > fs::file_size(largest)))
      largest = e.path();
  std::fstream f(largest, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(-1, std::ios::end);
  f.write(&c, 1);
  f.close();
  EXPECT_NE(WeightsFingerprint(a).value(), before);
}

TEST(WeightsFingerprintTest, DamagedOrMissingCheckpointsAreErrors) {
  testing::TempDir tmp("fingerprint-bad");
  EXPECT_EQ(WeightsFingerprint(tmp.path() + "/none").status().code(), StatusCode::kNotFound);
  fs::create_directories(tmp.path() + "/empty");
  EXPECT_EQ(WeightsFingerprint(tmp.path() + "/empty").status().code(), StatusCode::kNotFound);
  fs::create_directories(tmp.path() + "/short");
  std::ofstream(tmp.path() + "/short/model.safetensors") << "abc";
  auto s = WeightsFingerprint(tmp.path() + "/short");
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("model.safetensors"), std::string::npos) << s.status().ToString();
  fs::create_directories(tmp.path() + "/long-header");
  {
    std::ofstream out(tmp.path() + "/long-header/model.safetensors", std::ios::binary);
    const uint64_t n = 1 << 20;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_EQ(WeightsFingerprint(tmp.path() + "/long-header").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::model
