#include "services/router/api_auth.h"

#include <fstream>

#include <gtest/gtest.h>

#include "services/testing/child_process.h"

namespace pdserve::router {
namespace {

TEST(ApiAuthTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("sk-abc", "sk-abc"));
  EXPECT_FALSE(ConstantTimeEquals("sk-abc", "sk-abd"));
  EXPECT_FALSE(ConstantTimeEquals("sk-abc", "sk-ab"));
  EXPECT_FALSE(ConstantTimeEquals("sk-ab", "sk-abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("a\0", 2), "a"));
}

TEST(ApiAuthTest, FileAndCheck) {
  const std::string dir = services::testing::MakeTempDir("pdserve-auth");
  std::ofstream(dir + "/keys") << "# team A\n  sk-alpha  \n\n#sk-commented\nsk-beta\r\n";
  auto auth = ApiKeyAuth::LoadFile(dir + "/keys");
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  EXPECT_EQ(auth->key_count(), 2u);
  using V = ApiKeyAuth::Verdict;
  EXPECT_EQ(auth->Check("Bearer sk-alpha"), V::kAllowed);
  EXPECT_EQ(auth->Check("Bearer sk-beta"), V::kAllowed);
  EXPECT_EQ(auth->Check("Bearer sk-commented"), V::kInvalid);
  EXPECT_EQ(auth->Check("Bearer sk-alph"), V::kInvalid);
  EXPECT_EQ(auth->Check("Bearer sk-alphaX"), V::kInvalid);
  EXPECT_EQ(auth->Check(""), V::kMissing);
  EXPECT_EQ(auth->Check("Bearer "), V::kMissing);
  EXPECT_EQ(auth->Check("Basic c2stYWxwaGE="), V::kMissing);
  EXPECT_EQ(auth->Check("sk-alpha"), V::kMissing);
  EXPECT_EQ(auth->Check("Bearer  \t"), V::kInvalid);
  // The request API's bare key (submit.apiKey): no scheme, no trimming.
  EXPECT_EQ(auth->CheckKey("sk-beta"), V::kAllowed);
  EXPECT_EQ(auth->CheckKey(""), V::kMissing);
  EXPECT_EQ(auth->CheckKey("Bearer sk-beta"), V::kInvalid);
  EXPECT_EQ(auth->CheckKey("sk-beta "), V::kInvalid);
  EXPECT_EQ(auth->CheckKey("sk-bet"), V::kInvalid);

  auto missing = ApiKeyAuth::LoadFile(dir + "/nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/nope"), std::string::npos);
  std::ofstream(dir + "/empty") << "# only comments\n\n";
  EXPECT_NE(ApiKeyAuth::LoadFile(dir + "/empty").status().message().find("no API key"), std::string::npos);
  std::ofstream(dir + "/spaces") << "sk-ok\nsk has space\n";
  auto spaced = ApiKeyAuth::LoadFile(dir + "/spaces");
  EXPECT_EQ(spaced.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(spaced.status().message().find("line 2"), std::string::npos) << spaced.status().ToString();
}

}  // namespace
}  // namespace pdserve::router
