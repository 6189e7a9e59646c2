#include "common/npy.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/mapped_file.h"

namespace pdserve {
namespace {

TEST(NpyTest, RoundTripAndErrors) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / "pdserve_npy_test.npy").string();
  std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  ASSERT_TRUE(WriteNpyF32(path, v.data(), {2, 3}).ok());
  auto arr = ReadNpy(path);
  ASSERT_TRUE(arr.ok()) << arr.status().ToString();
  EXPECT_EQ(arr->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(arr->f32()[2], 3.25f);

  ASSERT_TRUE(WriteStringToFile(path, "not numpy").ok());
  EXPECT_EQ(ReadNpy(path).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadNpy(path + ".missing").status().code(), StatusCode::kNotFound);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pdserve
