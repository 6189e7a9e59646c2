// Constraint -> grammar, the free-text prefix (thinking mode), the %until marker automaton,
// and GrammarCache hits / misses / eviction / errors.
// To add a case: a Constraint and texts it must accept or refuse.
#include "grammar/constraint.h"

#include <gtest/gtest.h>

#include "grammar/ebnf_parser.h"
#include "grammar/matcher.h"
#include "grammar/testing_util.h"

namespace pdserve::grammar {
namespace {

bool Accepts(const std::shared_ptr<const CompiledGrammar>& c, const std::string& text) {
  GrammarMatcher m(c);
  return m.AcceptBytes(text).ok() && m.CanEnd();
}

TEST(Constraint, KindsBuild) {
  GrammarCache cache(testing::SmallVocabulary({}));
  Constraint schema{.kind = ConstraintKind::kJsonSchema, .text = R"({"type": "integer"})"};
  EXPECT_TRUE(Accepts(cache.Get(schema).value(), "12"));
  Constraint object{.kind = ConstraintKind::kJsonObject};
  EXPECT_TRUE(Accepts(cache.Get(object).value(), R"({"a": 1})"));
  Constraint regex{.kind = ConstraintKind::kRegex, .text = "[a-c]+"};
  EXPECT_TRUE(Accepts(cache.Get(regex).value(), "abca"));
  Constraint ebnf{.kind = ConstraintKind::kEbnf, .text = R"(root ::= "x" | "y")"};
  EXPECT_TRUE(Accepts(cache.Get(ebnf).value(), "y"));
  EXPECT_FALSE(BuildGrammar(Constraint{}).ok());
  auto bad = cache.Get(Constraint{.kind = ConstraintKind::kJsonSchema, .text = R"({"oneOf": []})"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(Constraint, FreeTextUntilMarker) {
  GrammarCache cache(testing::SmallVocabulary({"</think>", "</", "think>", "<"}));
  Constraint c{.kind = ConstraintKind::kJsonSchema, .text = R"({"type": "boolean"})", .free_text_until = "</think>"};
  auto g = cache.Get(c).value();
  EXPECT_TRUE(Accepts(g, "</think>true"));
  EXPECT_TRUE(Accepts(g, "hmm, <b> or </thin or <</think>\n false"));
  EXPECT_FALSE(Accepts(g, "true"));                      // the reasoning must end first
  EXPECT_FALSE(Accepts(g, "a</think>b</think>true"));    // only the first marker ends it
  GrammarMatcher m(g);
  ASSERT_TRUE(m.AcceptBytes("x <</thi").ok());
  EXPECT_TRUE(m.IsTokenAllowed(testing::FindToken(g->vocabulary(), "think>")));
  EXPECT_FALSE(m.CanEnd());
}

TEST(Constraint, UntilMarkersWithBorders) {
  // Markers whose prefixes repeat inside them exercise the KMP fallbacks.
  for (const std::string marker : {"aab", "abab", "aaa", "x"}) {
    auto g = GrammarFromEbnf("root ::= %until \"" + marker + "\" \"!\"").value();
    auto c = CompiledGrammar::Compile(g, testing::SmallVocabulary({})).value();
    for (const std::string prefix : {"", "a", "aa", "ab", "aba", "abaa", "aaab", "bbb"}) {
      const std::string text = prefix + marker + "!";
      const bool first_at_end = text.find(marker) == prefix.size();
      EXPECT_EQ(Accepts(c, text), first_at_end) << marker << " / " << text;
    }
  }
}

TEST(Constraint, CacheHitsAndEvicts) {
  GrammarCache cache(testing::SmallVocabulary({}), /*capacity=*/2);
  const Constraint a{.kind = ConstraintKind::kRegex, .text = "a"}, b{.kind = ConstraintKind::kRegex, .text = "b"},
      c{.kind = ConstraintKind::kRegex, .text = "c"};
  auto first = cache.Get(a).value();
  EXPECT_EQ(cache.Get(a).value(), first);
  EXPECT_EQ(cache.hits(), 1);
  (void)cache.Get(b).value();
  (void)cache.Get(c).value();  // evicts a
  EXPECT_NE(cache.Get(a).value(), first);
  EXPECT_EQ(cache.misses(), 4);
  // Options are part of the key.
  Constraint compact = a;
  compact.json.compact = true;
  EXPECT_NE(compact.Key(), a.Key());
}

}  // namespace
}  // namespace pdserve::grammar
