#include "tokenizer/regex.h"

#include <gtest/gtest.h>

namespace pdserve::tokenizer {
namespace {

// Returns the first match of `pattern` in `text` ("<none>" when there is none).
std::string FirstMatch(std::string_view pattern, std::string_view text,
                       RegexDialect dialect = RegexDialect::kEcmaScript) {
  auto re = Regex::Compile(pattern, dialect);
  EXPECT_TRUE(re.ok()) << re.status().ToString();
  if (!re.ok()) return "<error>";
  size_t b = 0, e = 0;
  Status error;
  if (!(*re)->Find(text, 0, &b, &e, &error)) return error.ok() ? "<none>" : "<error>";
  return std::string(text.substr(b, e - b));
}

TEST(Regex, UnicodePropertiesWork) {
  EXPECT_EQ(FirstMatch("\\p{L}+", "123 héllo"), "héllo");
  EXPECT_EQ(FirstMatch("\\p{N}{1,3}", "ab١٢٣٤"), "١٢٣");
  EXPECT_EQ(FirstMatch("[一-龥぀-ゟ゠-ヿ]+", "abc漢字かなカナxyz"), "漢字かなカナ");
}

TEST(Regex, EcmaScriptDialectMatchesJsClasses) {
  // JS \s includes U+FEFF and excludes U+0085; \d and \w are ASCII-only.
  EXPECT_EQ(FirstMatch("\\s+", "a\xEF\xBB\xBF b"), "\xEF\xBB\xBF ");
  EXPECT_EQ(FirstMatch("\\s", "a\xC2\x85"), "<none>");
  EXPECT_EQ(FirstMatch("\\d+", "٣3"), "3");
  EXPECT_EQ(FirstMatch("\\w+", "é_x1"), "_x1");
  EXPECT_EQ(FirstMatch("[^\\s\\p{L}]+", "ab!? \xEF\xBB\xBF"), "!?");
  EXPECT_EQ(FirstMatch("\\s+(?!\\S)", "a   b"), "  ");
}

TEST(Regex, UnicodeDialectUsesUcp) {
  EXPECT_EQ(FirstMatch("\\d+", "x٣3", RegexDialect::kUnicode), "٣3");
  EXPECT_EQ(FirstMatch("\\s", "a\xEF\xBB\xBF", RegexDialect::kUnicode), "<none>");
  EXPECT_EQ(FirstMatch("\\s", "a\xE3\x80\x80", RegexDialect::kUnicode), "\xE3\x80\x80");
}

TEST(Regex, TranslatesJsEscapes) {
  EXPECT_EQ(FirstMatch("\\u0041+", "xAAy"), "AA");
  EXPECT_EQ(FirstMatch("\\u{1F600}", "a😀"), "😀");
  auto t = Regex::Translate("[\\s]x\\s", RegexDialect::kEcmaScript);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->find("\\s"), std::string::npos) << *t;
}

TEST(Regex, FindsFromAnOffset) {
  auto re = Regex::Compile("a+", RegexDialect::kEcmaScript);
  ASSERT_TRUE(re.ok());
  size_t b, e;
  Status error;
  ASSERT_TRUE((*re)->Find("aa-aaa", 2, &b, &e, &error));
  EXPECT_EQ(b, 3u);
  EXPECT_EQ(e, 6u);
  EXPECT_FALSE((*re)->Find("aa-aaa", 6, &b, &e, &error));
  EXPECT_TRUE(error.ok());
}

TEST(Regex, BadPatternsGiveClearErrors) {
  auto bad = Regex::Compile("(unclosed", RegexDialect::kEcmaScript);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
  auto unsupported = Regex::Compile("[\\S]", RegexDialect::kEcmaScript);
  ASSERT_FALSE(unsupported.ok());
  EXPECT_EQ(unsupported.status().code(), StatusCode::kUnimplemented);
}

TEST(Regex, LongWhitespaceRunsDoNotExhaustTheStack) {
  const std::string spaces(200000, ' ');
  auto re = Regex::Compile("\\s+(?!\\S)|\\s+", RegexDialect::kEcmaScript);
  ASSERT_TRUE(re.ok());
  size_t b, e;
  Status error;
  ASSERT_TRUE((*re)->Find(spaces + "x", 0, &b, &e, &error)) << error.ToString();
  EXPECT_EQ(e - b, spaces.size() - 1);
}

}  // namespace
}  // namespace pdserve::tokenizer
