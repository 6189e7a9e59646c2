#include "common/status.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd value", "x=" + std::to_string(x));
  return x / 2;
}

Status UseHalf(int x, int* out) {
  PDSERVE_ASSIGN_OR_RETURN(*out, Half(x));
  return Status::Ok();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Status::NotFound("tensor missing", "file a.safetensors");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: tensor missing (file a.safetensors)");
  EXPECT_EQ(s.WithContext("loading").message(), "loading: tensor missing (file a.safetensors)");
}

TEST(StatusTest, ResultAndMacros) {
  int v = 0;
  EXPECT_TRUE(UseHalf(8, &v).ok());
  EXPECT_EQ(v, 4);
  Status s = UseHalf(7, &v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("x=7"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
