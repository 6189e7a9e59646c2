#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

namespace pdserve::tokenizer {
namespace {

using nlohmann::json;

std::vector<std::string> SplitText(const json& config, std::string_view text) {
  auto pt = PreTokenizer::FromJson(config, RegexDialect::kEcmaScript);
  EXPECT_TRUE(pt.ok()) << pt.status().ToString();
  if (!pt.ok()) return {};
  PieceArena arena;
  Pieces out;
  Status s = (*pt)->Split({text}, &out, &arena);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return std::vector<std::string>(out.begin(), out.end());
}

json SplitConfig(const std::string& behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
}

using V = std::vector<std::string>;

TEST(PreTokenizer, SplitBehaviors) {
  EXPECT_EQ(SplitText(SplitConfig("Isolated"), "a-b--c-"), (V{"a", "-", "b", "-", "-", "c", "-"}));
  EXPECT_EQ(SplitText(SplitConfig("Removed"), "a-b--c-"), (V{"a", "b", "c"}));
  EXPECT_EQ(SplitText(SplitConfig("MergedWithPrevious"), "a-b--c-"), (V{"a-", "b-", "-", "c-"}));
  EXPECT_EQ(SplitText(SplitConfig("MergedWithNext"), "-a-b--c"), (V{"-a", "-b", "-", "-c"}));
  EXPECT_EQ(SplitText(SplitConfig("Contiguous"), "a-b--c"), (V{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(SplitText(SplitConfig("Removed", true), "a-b--c"), (V{"-", "-", "-"}));
}

TEST(PreTokenizer, RegexSplitIsolated) {
  json config = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_EQ(SplitText(config, "ab1234567c"), (V{"ab", "123", "456", "7", "c"}));
  EXPECT_EQ(SplitText(config, ""), V{});
}

TEST(PreTokenizer, EmptyMatchesAdvanceOneCharacter) {
  json config = {{"type", "Split"}, {"pattern", {{"Regex", "x*"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_EQ(SplitText(config, "aé"), (V{"a", "é"}));
}

TEST(PreTokenizer, ByteLevelGpt2SplitAndPrefixSpace) {
  json config = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(SplitText(config, "Hello world's 42!!"), (V{" Hello", " world", "'s", " 42", "!!"}));
  json no_regex = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  EXPECT_EQ(SplitText(no_regex, "Hello world"), (V{"Hello world"}));
}

TEST(PreTokenizer, SequenceAppliesStagesInOrder) {
  json config = {{"type", "Sequence"},
                 {"pretokenizers",
                  {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
                   {{"type", "Digits"}, {"individual_digits", true}}}}};
  EXPECT_EQ(SplitText(config, "a1234"), (V{"a", "1", "2", "3", "4"}));
}

TEST(PreTokenizer, UnknownTypesAndMalformedConfigsAreErrors) {
  auto unknown = PreTokenizer::FromJson(json{{"type", "Metaspace"}}, RegexDialect::kEcmaScript);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnimplemented);
  auto bad_behavior = PreTokenizer::FromJson(SplitConfig("Sideways"), RegexDialect::kEcmaScript);
  EXPECT_EQ(bad_behavior.status().code(), StatusCode::kInvalidArgument);
  auto wrong_type = PreTokenizer::FromJson(
      json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Isolated"}, {"invert", "yes"}},
      RegexDialect::kEcmaScript);
  EXPECT_EQ(wrong_type.status().code(), StatusCode::kInvalidArgument);
  auto bad_regex = PreTokenizer::FromJson(
      json{{"type", "Split"}, {"pattern", {{"Regex", "[a-"}}}, {"behavior", "Isolated"}}, RegexDialect::kEcmaScript);
  EXPECT_EQ(bad_regex.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::tokenizer
