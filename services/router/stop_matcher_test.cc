#include "services/router/stop_matcher.h"

#include <gtest/gtest.h>

namespace pdserve::router {
namespace {

std::string Feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.Push(p);
  return out + m.Flush();
}

TEST(StopMatcherTest, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, StopAcrossPiecesIsNeverEmitted) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("hello S"), "hello ");  // "S" held back
  EXPECT_EQ(m.Push("T"), "");
  EXPECT_EQ(m.Push("O"), "");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.Push("P!"), "");
  EXPECT_TRUE(m.matched());
  StopMatcher m2({"STOP"});
  EXPECT_EQ(Feed(m2, {"a S", "TO", "P tail"}), "a ");
  EXPECT_TRUE(m2.matched());
  EXPECT_EQ(m2.matched_stop(), "STOP");
}

TEST(StopMatcherTest, FalseStartIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("ST"), "");
  EXPECT_EQ(m.Push("AR"), "STAR");
  EXPECT_EQ(Feed(m, {"ST"}), "ST");  // flushed at the end
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcherTest, EarliestAndLongestMatchWins) {
  StopMatcher m({"b", "ab", "abc"});
  EXPECT_EQ(Feed(m, {"xabcd"}), "x");
  EXPECT_EQ(m.matched_stop(), "abc");
  StopMatcher m2({"\n\n", "END"});
  EXPECT_EQ(Feed(m2, {"line\n", "\nmore END"}), "line");
}

TEST(StopMatcherTest, Utf8StopStrings) {
  StopMatcher m({"世界"});
  EXPECT_EQ(Feed(m, {"你好", "世", "界!"}), "你好");
  EXPECT_TRUE(m.matched());
}

}  // namespace
}  // namespace pdserve::router
