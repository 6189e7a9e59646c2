// Matcher and compiler tests over hand-built grammars and a small byte-level vocabulary.
// To add a case: build a Grammar, compile it over SmallVocabulary(), walk some text and call
// ExpectMaskMatchesDefinition at each step (the mask must equal per-token acceptance).
#include "grammar/matcher.h"

#include <random>

#include <gtest/gtest.h>

#include "grammar/bitmask.h"
#include "grammar/testing_util.h"

namespace pdserve::grammar {
namespace {

using testing::ExpectMaskMatchesDefinition;
using testing::JsonishTokens;
using testing::SmallVocabulary;

std::shared_ptr<const CompiledGrammar> MustCompile(const Grammar& g, std::shared_ptr<const Vocabulary> v,
                                                   const CompileOptions& o = {}) {
  auto c = CompiledGrammar::Compile(g, std::move(v), o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? c.value() : nullptr;
}

// Walks `text` byte-token by byte-token (ids 0..255), checking the mask before each byte.
void WalkChecking(GrammarMatcher& m, const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    ExpectMaskMatchesDefinition(m, "before byte " + std::to_string(i) + " of '" + text + "'");
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(m.AcceptToken(static_cast<uint8_t>(text[i])).ok()) << "byte " << i << " of '" << text << "'";
  }
  ExpectMaskMatchesDefinition(m, "after '" + text + "'");
}

TEST(Matcher, LiteralGrammar) {
  int32_t stop = 0;
  auto v = SmallVocabulary({"ab", "abc", "abcd", "bc"}, &stop);
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  g.Define(root, g.Bytes("abc"));
  g.SetRoot(root);
  auto c = MustCompile(g, v);
  GrammarMatcher m(c);
  std::vector<uint32_t> mask(static_cast<size_t>(v->mask_words()));
  m.FillNextTokenBitmask(mask.data());
  EXPECT_EQ(CountAllowed(mask.data(), v->size()), 3);  // a, ab, abc
  EXPECT_TRUE(MaskAllows(mask.data(), 256 + 1));     // "abc"
  EXPECT_FALSE(MaskAllows(mask.data(), 256 + 2));    // "abcd" runs past the end
  EXPECT_FALSE(MaskAllows(mask.data(), stop));
  ASSERT_TRUE(m.AcceptToken(256).ok());  // "ab"
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.AcceptToken(stop).ok());
  EXPECT_FALSE(m.AcceptToken('x').ok());
  ASSERT_TRUE(m.AcceptToken('c').ok());
  EXPECT_TRUE(m.CanEnd());
  m.FillNextTokenBitmask(mask.data());
  EXPECT_EQ(CountAllowed(mask.data(), v->size()), 1);
  EXPECT_TRUE(MaskAllows(mask.data(), stop));
  ASSERT_TRUE(m.AcceptToken(stop).ok());
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.FillNextTokenBitmask(mask.data()));
  EXPECT_EQ(m.AcceptToken('a').code(), StatusCode::kFailedPrecondition);
}

TEST(Matcher, SpecialAndByteLessIdsAreNeverAllowed) {
  int32_t stop = 0;
  auto v = SmallVocabulary({}, &stop);
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  g.Define(root, g.Star(g.ByteSet({{0, 255}})));
  g.SetRoot(root);
  GrammarMatcher m(MustCompile(g, v));
  std::vector<uint32_t> mask(static_cast<size_t>(v->mask_words()));
  m.FillNextTokenBitmask(mask.data());
  EXPECT_EQ(CountAllowed(mask.data(), v->size()), 256 + 1);  // bytes + stop
  EXPECT_FALSE(MaskAllows(mask.data(), stop - 1));           // <special>
  for (int32_t id = stop + 1; id < v->size(); ++id) EXPECT_FALSE(MaskAllows(mask.data(), id));
  EXPECT_FALSE(m.AcceptToken(stop - 1).ok());
  EXPECT_FALSE(m.AcceptToken(static_cast<int32_t>(v->size())).ok());
}

TEST(Matcher, RepetitionAlternationAndCharSets) {
  auto v = SmallVocabulary(JsonishTokens());
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  // ("ab" | [à-ÿ日-本]){2,5} "." ?
  const ExprId unit = g.Alt({g.Bytes("ab"), g.CharSet({{0xE0, 0xFF}, {0x65E5, 0x672C}})});
  g.Define(root, g.Seq({g.Repeat(unit, 2, 5), g.Optional(g.Bytes("."))}));
  g.SetRoot(root);
  auto c = MustCompile(g, v);
  for (const std::string text : {"abab", "ab\xC3\xA9", "\xE6\x97\xA5\xE6\x9C\xAC.", "abababab\xC3\xBF."}) {
    GrammarMatcher m(c);
    WalkChecking(m, text);
    EXPECT_TRUE(m.CanEnd()) << text;
  }
  GrammarMatcher m(c);
  EXPECT_FALSE(m.AcceptBytes("ababababab" "ab").ok());  // 6 units
  EXPECT_TRUE(GrammarMatcher(c).AcceptBytes("ab\xC3").ok());          // a valid prefix
  EXPECT_FALSE(GrammarMatcher(c).AcceptBytes("ab\xC3\x28").ok());      // broken UTF-8
}

// Balanced parentheses need a stack: tokens like "))" depend on the depth below.
Grammar Parens() {
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  const RuleId p = g.DeclareRule("p");
  g.Define(p, g.Seq({g.Bytes("("), g.Star(g.Ref(p)), g.Bytes(")")}));
  g.Define(root, g.Plus(g.Ref(p)));
  g.SetRoot(root);
  return g;
}

TEST(Matcher, RecursionUsesUncertainTokensCorrectly) {
  auto v = SmallVocabulary(JsonishTokens());
  auto c = MustCompile(Parens(), v);
  EXPECT_EQ(c->n_automata(), 2);
  for (const std::string text : {"()", "(())", "((()())())", "()(())((()))"}) {
    GrammarMatcher m(c);
    WalkChecking(m, text);
    EXPECT_TRUE(m.CanEnd()) << text;
  }
  GrammarMatcher m(c);
  EXPECT_FALSE(m.AcceptBytes(")").ok());
  ASSERT_TRUE(m.AcceptBytes("((()").ok());
  EXPECT_TRUE(m.IsTokenAllowed(testing::FindToken(*v, "))")));
  EXPECT_TRUE(m.IsTokenAllowed(testing::FindToken(*v, ")(")));
  EXPECT_FALSE(m.AcceptBytes(")))").ok());
  EXPECT_GT(c->state_mask_misses(), 0);
}

TEST(Matcher, RandomWalksMatchDefinition) {
  auto v = SmallVocabulary(JsonishTokens());
  auto c = MustCompile(Parens(), v);
  std::mt19937 rng(7);
  std::vector<uint32_t> mask(static_cast<size_t>(v->mask_words()));
  for (int walk = 0; walk < 20; ++walk) {
    GrammarMatcher m(c);
    for (int step = 0; step < 40 && !m.IsTerminated(); ++step) {
      ExpectMaskMatchesDefinition(m, "walk " + std::to_string(walk) + " step " + std::to_string(step));
      if (HasFatalFailure()) return;
      m.FillNextTokenBitmask(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < v->size(); ++id)
        if (MaskAllows(mask.data(), id)) allowed.push_back(id);
      ASSERT_FALSE(allowed.empty());
      ASSERT_TRUE(m.AcceptToken(allowed[rng() % allowed.size()]).ok());
    }
  }
}

TEST(Matcher, NullableRecursionAndNestedCalls) {
  // root ::= list ; list ::= "[" (item ("," item)*)? "]" ; item ::= list | "x" | ""
  auto v = SmallVocabulary(JsonishTokens());
  Grammar g;
  const RuleId root = g.DeclareRule("root"), list = g.DeclareRule("list"), item = g.DeclareRule("item");
  g.Define(item, g.Alt({g.Ref(list), g.Bytes("x"), g.Empty()}));
  g.Define(list, g.Seq({g.Bytes("["), g.Optional(g.Seq({g.Ref(item), g.Star(g.Seq({g.Bytes(","), g.Ref(item)}))})),
                        g.Bytes("]")}));
  g.Define(root, g.Ref(list));
  g.SetRoot(root);
  auto c = MustCompile(g, v);
  for (const std::string text : {"[]", "[,]", "[[x],[],x,]", "[[[[]]],[x,[x]]]"}) {
    GrammarMatcher m(c);
    WalkChecking(m, text);
    EXPECT_TRUE(m.CanEnd()) << text;
  }
}

TEST(Compiler, Errors) {
  auto v = SmallVocabulary({});
  {
    Grammar g;  // no root
    EXPECT_EQ(CompiledGrammar::Compile(g, v).status().code(), StatusCode::kInvalidArgument);
  }
  {
    Grammar g;
    const RuleId root = g.DeclareRule("root");
    g.Define(root, g.Ref(g.DeclareRule("missing")));
    g.SetRoot(root);
    auto c = CompiledGrammar::Compile(g, v);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("missing"), std::string::npos) << c.status().ToString();
  }
  {
    Grammar g;  // expr ::= expr "+" "x" | "x"
    const RuleId root = g.DeclareRule("root"), e = g.DeclareRule("expr");
    g.Define(e, g.Alt({g.Seq({g.Ref(e), g.Bytes("+x")}), g.Bytes("x")}));
    g.Define(root, g.Ref(e));
    g.SetRoot(root);
    auto c = CompiledGrammar::Compile(g, v);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("left-recursive"), std::string::npos) << c.status().ToString();
  }
  {
    Grammar g;  // an empty character set matches nothing
    const RuleId root = g.DeclareRule("root");
    g.Define(root, g.Seq({g.Bytes("a"), g.CharSet({}, false)}));
    g.SetRoot(root);
    auto c = CompiledGrammar::Compile(g, v);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("matches no text"), std::string::npos);
  }
  {
    Grammar g;  // size bound
    const RuleId root = g.DeclareRule("root");
    g.Define(root, g.Repeat(g.Bytes("abcdefgh"), 0, 100000));
    g.SetRoot(root);
    auto c = CompiledGrammar::Compile(g, v, CompileOptions{.max_nfa_states = 10000});
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("too large"), std::string::npos);
  }
}

TEST(Compiler, DeadBranchesArePruned) {
  // "a" [] | "b": the "a" branch can never finish, so "a" must not be allowed.
  auto v = SmallVocabulary({});
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  g.Define(root, g.Alt({g.Seq({g.Bytes("a"), g.CharSet({}, false)}), g.Bytes("b")}));
  g.SetRoot(root);
  GrammarMatcher m(MustCompile(g, v));
  EXPECT_FALSE(m.IsTokenAllowed('a'));
  EXPECT_TRUE(m.IsTokenAllowed('b'));
}

TEST(Matcher, SerializeRoundTripAndReplay) {
  int32_t stop = 0;
  auto v = SmallVocabulary(JsonishTokens(), &stop);
  auto c = MustCompile(Parens(), v);
  GrammarMatcher m(c);
  const std::vector<int32_t> ids = {'(', testing::FindToken(*v, ")("), ')', '('};  // ()()(
  ASSERT_TRUE(m.AcceptTokens(ids).ok());
  const std::string bytes = m.Serialize();
  auto back = GrammarMatcher::Deserialize(c, bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  GrammarMatcher replay(c);
  ASSERT_TRUE(replay.AcceptTokens(ids).ok());
  EXPECT_EQ(back->Serialize(), bytes);
  EXPECT_EQ(replay.Serialize(), bytes);
  std::vector<uint32_t> a(static_cast<size_t>(v->mask_words())), b(a.size());
  m.FillNextTokenBitmask(a.data());
  back->FillNextTokenBitmask(b.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(back->n_tokens(), 4);
  // A different grammar, a truncated or corrupted state.
  Grammar other;
  other.SetRoot(other.DeclareRule("root"));
  other.Define(0, other.Bytes("x"));
  EXPECT_EQ(GrammarMatcher::Deserialize(MustCompile(other, v), bytes).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(GrammarMatcher::Deserialize(c, bytes.substr(0, bytes.size() - 1)).status().code(), StatusCode::kDataLoss);
  std::string bad = bytes;
  bad[bad.size() - 2] = '\x7f';  // a node id far out of range
  EXPECT_EQ(GrammarMatcher::Deserialize(c, bad).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(GrammarMatcher::Deserialize(c, "nonsense").status().code(), StatusCode::kDataLoss);
}

TEST(Matcher, DepthLimit) {
  auto v = SmallVocabulary({});
  auto c = MustCompile(Parens(), v, CompileOptions{.max_stack_depth = 4});
  GrammarMatcher m(c);
  EXPECT_TRUE(m.AcceptBytes("((").ok());
  EXPECT_FALSE(m.AcceptBytes("((((").ok());
  // A grammar that must call deeper right after a byte: the byte is allowed (the mask does not
  // know the depth) and the matcher then reports a dead end instead of a mask.
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  g.Define(root, g.Alt({g.Seq({g.Bytes("("), g.Ref(root), g.Bytes(")")}), g.Bytes("x")}));
  g.SetRoot(root);
  GrammarMatcher n(MustCompile(g, v, CompileOptions{.max_stack_depth = 2}));
  std::vector<uint32_t> mask(static_cast<size_t>(v->mask_words()));
  ASSERT_TRUE(n.AcceptBytes("(").ok());
  ASSERT_TRUE(n.FillNextTokenBitmask(mask.data()));
  EXPECT_TRUE(MaskAllows(mask.data(), '('));
  ASSERT_TRUE(n.AcceptToken('(').ok());
  EXPECT_FALSE(n.FillNextTokenBitmask(mask.data()));
  EXPECT_FALSE(n.CanEnd());
}

TEST(Matcher, CopiesAreIndependent) {
  auto v = SmallVocabulary({});
  auto c = MustCompile(Parens(), v);
  GrammarMatcher a(c);
  ASSERT_TRUE(a.AcceptBytes("((").ok());
  GrammarMatcher b = a;
  ASSERT_TRUE(b.AcceptBytes("))").ok());
  EXPECT_TRUE(b.CanEnd());
  EXPECT_FALSE(a.CanEnd());
}

}  // namespace
}  // namespace pdserve::grammar
