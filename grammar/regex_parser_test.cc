// Regex front end against std::regex (ECMAScript) on ASCII candidates, the JSON-string form,
// the search (unanchored) form and the refused constructs.
// To add a case: a {pattern, candidates} row to kCases (candidates both matching and not).
#include "grammar/regex_parser.h"

#include <regex>

#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "grammar/testing_util.h"

namespace pdserve::grammar {
namespace {

bool Accepts(const std::shared_ptr<const CompiledGrammar>& c, const std::string& text) {
  GrammarMatcher m(c);
  return m.AcceptBytes(text).ok() && m.CanEnd();
}

std::shared_ptr<const CompiledGrammar> CompileRegex(const std::string& pattern, const RegexOptions& o = {}) {
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  auto e = AddRegex(&g, pattern, o);
  EXPECT_TRUE(e.ok()) << pattern << ": " << e.status().ToString();
  if (!e.ok()) return nullptr;
  g.Define(root, *e);
  g.SetRoot(root);
  auto c = CompiledGrammar::Compile(g, testing::SmallVocabulary({}));
  EXPECT_TRUE(c.ok()) << pattern << ": " << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

struct Case {
  std::string pattern;
  std::vector<std::string> candidates;
};

const std::vector<Case> kCases = {
    {"abc", {"abc", "ab", "abcd", ""}},
    {"a|bc|", {"a", "bc", "", "abc", "b"}},
    {"a*b+c?", {"b", "aab", "abbbc", "ac", "", "abcc"}},
    {"(ab){2,3}", {"abab", "ababab", "ab", "abababab"}},
    {"x{2}y{1,}z{0,2}", {"xxy", "xxyyyzz", "xy", "xxyzzz"}},
    {"[a-c][^a-c]", {"ad", "cz", "aa", "d1", "a"}},
    {"[\\d\\s-]+", {"1 2-3", "a", "", "\t9"}},
    {"\\w+@\\w+\\.com", {"me@x.com", "a_b@c1.com", "@x.com", "me@x.org"}},
    {"(?:a|b)(c|d)", {"ac", "bd", "ab", "cd"}},
    {"\\x41\\u0042\\t\\.", {"AB\t.", "AB\tx"}},
    {"^\\d{3}-\\d{4}$", {"555-1234", "55-1234", "5555-1234"}},
    {"[.]\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\/", {".*+?()[]{}|\\/", "x*+?()[]{}|\\/"}},
    {".+", {"a\n", "abc", "", " "}},
    {"a+?b*?", {"a", "aab", ""}},
    {"(a|ab)(c|bcd)(d*)", {"abcd", "acd", "abcdd", "abd"}},
};

TEST(Regex, MatchesStdRegex) {
  for (const Case& c : kCases) {
    auto compiled = CompileRegex(c.pattern);
    ASSERT_NE(compiled, nullptr);
    const std::regex reference(c.pattern, std::regex::ECMAScript);
    for (const std::string& s : c.candidates)
      EXPECT_EQ(Accepts(compiled, s), std::regex_match(s, reference)) << "/" << c.pattern << "/ on '" << s << "'";
  }
}

TEST(Regex, EcmaScriptCornerCases) {
  auto braces = CompileRegex("a{,2}");  // not a quantifier: literal braces
  EXPECT_TRUE(Accepts(braces, "a{,2}"));
  EXPECT_FALSE(Accepts(braces, "aa"));
  auto named = CompileRegex("(?<n>c|d)x");
  EXPECT_TRUE(Accepts(named, "dx"));
  EXPECT_FALSE(Accepts(named, "x"));
  auto any = CompileRegex("[^]");
  EXPECT_TRUE(Accepts(any, "\n"));
  EXPECT_TRUE(Accepts(any, "x"));
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  g.Define(root, g.Alt({AddRegex(&g, "[]").value(), g.Bytes("z")}));
  g.SetRoot(root);
  GrammarMatcher m(CompiledGrammar::Compile(g, testing::SmallVocabulary({})).value());
  EXPECT_FALSE(m.IsTokenAllowed('a'));  // [] matches nothing
  EXPECT_TRUE(m.IsTokenAllowed('z'));
}

TEST(Regex, SearchModeIsUnanchored) {
  auto c = CompileRegex("b+c", RegexOptions{.search = true});
  for (const std::string s : {"bc", "abbcd", "xxbc", "bcx"}) EXPECT_TRUE(Accepts(c, s)) << s;
  for (const std::string s : {"", "ab", "cb"}) EXPECT_FALSE(Accepts(c, s)) << s;
  auto anchored = CompileRegex("^b+|c$", RegexOptions{.search = true});
  for (const std::string s : {"bx", "b", "xc", "c"}) EXPECT_TRUE(Accepts(anchored, s)) << s;
  for (const std::string s : {"xb", "cx"}) EXPECT_FALSE(Accepts(anchored, s)) << s;
}

TEST(Regex, JsonStringFormEscapes) {
  // Characters that JSON escapes appear escaped; the rest verbatim.
  auto c = CompileRegex("a\"b\\\\c\\n[\\x00-\\x02]é", RegexOptions{.json_string = true});
  EXPECT_TRUE(Accepts(c, "a\\\"b\\\\c\\n\\u0001é"));
  EXPECT_FALSE(Accepts(c, "a\"b\\\\c\\n\\u0001é"));
  EXPECT_FALSE(Accepts(c, std::string("a\\\"b\\\\c\n\\u0001é")));
  auto dot = CompileRegex(".{2}", RegexOptions{.json_string = true});
  EXPECT_TRUE(Accepts(dot, "\\\"\\t"));
  EXPECT_FALSE(Accepts(dot, "\\n"));  // '.' excludes the newline
  EXPECT_TRUE(Accepts(dot, "日本"));
}

TEST(Regex, UnicodeClasses) {
  auto c = CompileRegex("[α-ω]+\\s[^\\x00-\\x7F]");
  EXPECT_TRUE(Accepts(c, "αβγ\u3000日"));
  EXPECT_FALSE(Accepts(c, "abc d"));
  EXPECT_TRUE(Accepts(CompileRegex("\\u{1F600}"), "\xF0\x9F\x98\x80"));
}

TEST(Regex, RefusedConstructs) {
  for (const std::string p : {"(a)\\1", "a(?=b)", "(?!a)b", "(?<=a)b", "\\bword", "\\p{L}", "a^b", "a$b", "*a", "a**",
                              "(ab", "ab)", "[b-a]", "a{3,2}", "a{20000}", "\\", "[a", "\\uD800", "\\k<n>"}) {
    Grammar g;
    auto e = AddRegex(&g, p);
    EXPECT_FALSE(e.ok()) << p;
    if (!e.ok()) {
      EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(e.status().message().find("offset"), std::string::npos) << e.status().ToString();
    }
  }
  EXPECT_FALSE(GrammarFromRegex("\xC3").ok());  // not UTF-8
}

}  // namespace
}  // namespace pdserve::grammar
