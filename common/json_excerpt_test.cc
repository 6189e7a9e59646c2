#include "common/json_excerpt.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(JsonExcerptTest, ScalarsAndSmallValuesAsDumped) {
  EXPECT_EQ(JsonExcerpt(nlohmann::json(5)), "5");
  EXPECT_EQ(JsonExcerpt(nlohmann::json("BF16")), "\"BF16\"");
  EXPECT_EQ(JsonExcerpt(nlohmann::json::parse("[1, -2, \"x\"]")), "[1, -2, \"x\"]");
  EXPECT_EQ(JsonExcerpt(nlohmann::json::parse(R"({"a": [1, {"b": 2}]})")), "{\"a\": [1, {\"b\": 2}]}");
}

// Regression: dump() of a value nested 200k deep (a 400 KB header or request) overflowed the
// stack; error messages now render an excerpt.
TEST(JsonExcerptTest, DeepAndLargeValuesAreBounded) {
  const int depth = 200000;
  std::string text(depth, '[');
  text += std::string(depth, ']');
  const auto deep = nlohmann::json::parse(text);
  EXPECT_EQ(JsonExcerpt(deep), "[[[[...]]]]");
  nlohmann::json wide = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) wide.push_back(i);
  const std::string w = JsonExcerpt(wide, 50);
  EXPECT_LT(w.size(), 80u);
  EXPECT_NE(w.find("..."), std::string::npos);
  const std::string s = JsonExcerpt(nlohmann::json(std::string(10000, 'a')), 20);
  EXPECT_EQ(s, "\"" + std::string(20, 'a') + "\"...");
}

}  // namespace
}  // namespace pdserve
