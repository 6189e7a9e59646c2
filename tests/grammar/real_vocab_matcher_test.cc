// Matchers over the real DeepSeek vocabulary: the mask equals per-token acceptance at states
// where context-dependent ("uncertain") tokens matter (strings and numbers inside the recursive
// json_object grammar), EOS exactly when complete, special ids never, truncation visible to
// the caller, and P/D hand-over by serialization and by replay giving the same masks.
// To add a case: a text prefix to kPrefixes (the mask is checked after each of its tokens).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar/bitmask.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tests/grammar/deepseek_vocabulary.h"

namespace pdserve::grammar {
namespace {

using testing::DeepSeekTokenizer;
using testing::DeepSeekVocabulary;

void ExpectMaskMatchesDefinition(GrammarMatcher& m, const std::string& where) {
  const Vocabulary& v = m.grammar().vocabulary();
  std::vector<uint32_t> mask(static_cast<size_t>(v.mask_words()));
  m.FillNextTokenBitmask(mask.data());
  int64_t mismatches = 0;
  for (int32_t id = 0; id < v.size(); ++id) {
    if (MaskAllows(mask.data(), id) != m.IsTokenAllowed(id)) {
      if (++mismatches < 5)
        ADD_FAILURE() << where << ": token " << id << " '" << std::string(v.bytes(id)) << "' mask says "
                      << MaskAllows(mask.data(), id);
    }
  }
  EXPECT_EQ(mismatches, 0) << where;
}

std::vector<int32_t> Encode(const std::string& text) {
  return DeepSeekTokenizer()->Encode(text).value();
}

const std::vector<std::string> kPrefixes = {
    R"({"a": [1, 2.5e3, {"b": "x\"y", "c": [true, null, "日本語"]}], "d": -0.125, "e": {}})",
    "{\n  \"list\": [\n    \"one\",\n    \"two\"\n  ],\n  \"n\": 42\n}",
};

TEST(RealVocab, JsonObjectMasksMatchDefinition) {
  auto vocab = DeepSeekVocabulary();
  ASSERT_NE(vocab, nullptr);
  auto c = CompiledGrammar::Compile(GrammarForJsonObject(), vocab);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (const std::string& text : kPrefixes) {
    GrammarMatcher m(*c);
    const std::vector<int32_t> ids = Encode(text);
    for (size_t i = 0; i < ids.size(); ++i) {
      ExpectMaskMatchesDefinition(m, "before token " + std::to_string(i) + " of " + text);
      if (HasFailure()) return;
      ASSERT_TRUE(m.AcceptToken(ids[i]).ok()) << "token " << i << " of " << text;
    }
    EXPECT_TRUE(m.CanEnd());
    EXPECT_TRUE(m.IsTokenAllowed(1));  // EOS
    ASSERT_TRUE(m.AcceptToken(1).ok());
    EXPECT_TRUE(m.IsTerminated());
  }
}

TEST(RealVocab, SpecialAndPaddingIdsNeverAllowed) {
  auto vocab = DeepSeekVocabulary();
  ASSERT_NE(vocab, nullptr);
  auto c = CompiledGrammar::Compile(GrammarFromJsonSchema(R"({"type": "string"})").value(), vocab).value();
  GrammarMatcher m(c);
  ASSERT_TRUE(m.AcceptBytes("\"").ok());
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  m.FillNextTokenBitmask(mask.data());
  EXPECT_GT(CountAllowed(mask.data(), vocab->size()), 100000);  // almost any text fits a string
  for (int32_t id : {0, 1, 128791, 128805}) EXPECT_FALSE(MaskAllows(mask.data(), id)) << id;
  for (int32_t id = 128815; id < vocab->size(); ++id) ASSERT_FALSE(MaskAllows(mask.data(), id)) << id;
  // The tool-call markers are text: inside a JSON string they are ordinary characters.
  EXPECT_TRUE(MaskAllows(mask.data(), 128814));
}

TEST(RealVocab, TruncationIsVisibleToTheCaller) {
  auto vocab = DeepSeekVocabulary();
  ASSERT_NE(vocab, nullptr);
  auto c = CompiledGrammar::Compile(
                GrammarFromJsonSchema(R"({"type": "object", "properties": {"name": {"type": "string"}},
                                          "required": ["name"]})").value(), vocab).value();
  const std::string full = R"({"name": "a fairly long value that needs several tokens"})";
  const std::vector<int32_t> ids = Encode(full);
  ASSERT_GT(ids.size(), 6u);
  // max_tokens = 5: the caller stops mid-JSON; the matcher is not complete, so the response
  // reports finish_reason "length"; the text is a prefix that does not parse.
  GrammarMatcher m(c);
  ASSERT_TRUE(m.AcceptTokens(std::span<const int32_t>(ids.data(), 5)).ok());
  EXPECT_FALSE(m.IsTerminated());
  EXPECT_FALSE(m.CanEnd());
  const std::string prefix = DeepSeekTokenizer()->Decode(std::span<const int32_t>(ids.data(), 5)).value();
  EXPECT_FALSE(nlohmann::json::accept(prefix));
  ASSERT_TRUE(m.AcceptTokens(std::span<const int32_t>(ids.data() + 5, ids.size() - 5)).ok());
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(nlohmann::json::accept(full));
}

TEST(RealVocab, HandOverBySerializeOrReplayGivesSameMasks) {
  auto vocab = DeepSeekVocabulary();
  ASSERT_NE(vocab, nullptr);
  const std::string schema = R"({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}},
                                 "child": {"$ref": "#"}}})";
  // Prefill and decode compile the same constraint independently.
  auto prefill_side = CompiledGrammar::Compile(GrammarFromJsonSchema(schema).value(), vocab).value();
  auto decode_side = CompiledGrammar::Compile(GrammarFromJsonSchema(schema).value(), vocab).value();
  EXPECT_EQ(prefill_side->fingerprint(), decode_side->fingerprint());
  const std::vector<int32_t> ids = Encode(R"({"tags": ["a", "b"], "child": {"tags": ["x)");
  GrammarMatcher prefill(prefill_side);
  ASSERT_TRUE(prefill.AcceptTokens(ids).ok());
  auto moved = GrammarMatcher::Deserialize(decode_side, prefill.Serialize());
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  GrammarMatcher replayed(decode_side);
  ASSERT_TRUE(replayed.AcceptTokens(ids).ok());
  std::vector<uint32_t> a(static_cast<size_t>(vocab->mask_words())), b(a.size()), r(a.size());
  prefill.FillNextTokenBitmask(a.data());
  moved->FillNextTokenBitmask(b.data());
  replayed.FillNextTokenBitmask(r.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, r);
  ExpectMaskMatchesDefinition(*moved, "after hand-over");
}

}  // namespace
}  // namespace pdserve::grammar
