// EBNF front end: syntax, embedded %json / %regex, errors with line:column, and ToEbnf() text
// parsing back to a grammar with the same language.
// To add a case: a grammar and strings it must accept / reject to kGrammars.
#include "grammar/ebnf_parser.h"

#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "grammar/testing_util.h"

namespace pdserve::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(const Grammar& g) {
  auto c = CompiledGrammar::Compile(g, testing::SmallVocabulary({}));
  EXPECT_TRUE(c.ok()) << c.status().ToString() << "\n" << g.ToEbnf();
  return c.ok() ? *c : nullptr;
}

bool Accepts(const std::shared_ptr<const CompiledGrammar>& c, const std::string& text) {
  GrammarMatcher m(c);
  return m.AcceptBytes(text).ok() && m.CanEnd();
}

struct GrammarCase {
  std::string ebnf;
  std::vector<std::string> accept, reject;
};

const std::vector<GrammarCase> kGrammars = {
    {R"(root ::= "a" b* | 'c'   # comment
        b ::= [x-z] "!"?)",
     {"a", "axy!z", "c"}, {"", "ab", "cx", "a!"}},
    {R"(list ::= "[" (item ("," item)*)? "]"
        item ::= list | [0-9]+)",
     {"[]", "[1,[2,[]],33]"}, {"[", "[1,]", "[[]"}},
    {R"(root ::= %json {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]} "\n")",
     {"{\"n\": 12}\n", "{\"n\":-3}\n"}, {"{}\n", "{\"n\": 1.5}\n", "{\"n\": 1}"}},
    {R"(root ::= %regex "[a-c]{2}\\d" ("." %regex '\\w+')?)", {"ab1", "cc9.word"}, {"ab", "abc1", "ab1."}},
    {R"(root ::= %x41-43 %xFF? "\u00e9\x21\U0001F600")", {"A\xC3\xA9!\xF0\x9F\x98\x80", "C\xFF\xC3\xA9!\xF0\x9F\x98\x80"},
     {"D\xC3\xA9!\xF0\x9F\x98\x80"}},
    {R"(root ::= x{2} y{1,} z{0,2} . 
        x ::= "x"
        y ::= "y"
        z ::= [^a-y])",
     {"xxyzz", "xxyyyq", "xxy日"}, {"xyq", "xxyzzzq"}},
    {R"(root ::= "{" ws "}" 
        ws ::= [ \t\n]{0,3})", {"{}", "{ \n\t}"}, {"{    }"}},
};

TEST(Ebnf, Languages) {
  for (const GrammarCase& gc : kGrammars) {
    auto g = GrammarFromEbnf(gc.ebnf);
    ASSERT_TRUE(g.ok()) << gc.ebnf << "\n" << g.status().ToString();
    auto c = Compile(*g);
    ASSERT_NE(c, nullptr);
    for (const std::string& s : gc.accept) EXPECT_TRUE(Accepts(c, s)) << gc.ebnf << " on " << s;
    for (const std::string& s : gc.reject) EXPECT_FALSE(Accepts(c, s)) << gc.ebnf << " on " << s;
    // The printed form parses back to the same language.
    const std::string printed = g->ToEbnf();
    auto again = GrammarFromEbnf(printed);
    ASSERT_TRUE(again.ok()) << printed << "\n" << again.status().ToString();
    auto c2 = Compile(*again);
    ASSERT_NE(c2, nullptr);
    for (const std::string& s : gc.accept) EXPECT_TRUE(Accepts(c2, s)) << printed << " on " << s;
    for (const std::string& s : gc.reject) EXPECT_FALSE(Accepts(c2, s)) << printed << " on " << s;
    EXPECT_EQ(again->ToEbnf(), printed);
  }
}

TEST(Ebnf, ErrorsNameTheSpot) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"root ::= \"a", "unterminated string literal at line 1:12"},
      {"root ::= a\n", "rule 'a' is used but never defined"},
      {"root ::= (\"a\"", "expected ')'"},
      {"root \"a\"", "expected '::='"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice at line 2:1"},
      {"root ::= \"a\"{5,2}", "m < n"},
      {"root ::= \"a\"{99999}", "above 10000"},
      {"root ::= [z-a]", "out of order"},
      {"root ::= %json {\"type\": \"object\", \"minProperties\": 1}", "unsupported keyword 'minProperties' at #"},
      {"root ::=\n  %json {\"type\": 3", "unterminated %json"},
      {"root ::= %regex \"(a\"", "regex: missing ')'"},
      {"root ::= @", "unexpected '@'"},
      {"", "no rules"},
      {"root ::= \"\\x4\"", "bad hex escape"},
  };
  for (const auto& [text, want] : cases) {
    auto g = GrammarFromEbnf(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(want), std::string::npos) << text << "\n -> " << g.status().ToString();
  }
  auto left = GrammarFromEbnf("root ::= e\ne ::= e \"+\" \"x\" | \"x\"");
  ASSERT_TRUE(left.ok());
  auto c = CompiledGrammar::Compile(*left, testing::SmallVocabulary({}));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'e' is left-recursive"), std::string::npos) << c.status().ToString();
}

TEST(Ebnf, RootIsNamedRootElseFirst) {
  auto g = GrammarFromEbnf("a ::= \"x\"\nroot ::= \"y\"");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Accepts(Compile(*g), "y"));
  auto h = GrammarFromEbnf("a ::= b\nb ::= \"x\"");
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(Accepts(Compile(*h), "x"));
}

}  // namespace
}  // namespace pdserve::grammar
