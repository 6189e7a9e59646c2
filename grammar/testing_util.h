// Test helpers for grammar/ (not part of the library): a small byte-level vocabulary, and a
// reference check that a matcher's mask equals the token-by-token definition.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "grammar/bitmask.h"
#include "grammar/compiled_grammar.h"
#include "grammar/matcher.h"
#include "grammar/vocabulary.h"

namespace pdserve::grammar::testing {

// Ids 0..255: every single byte; then `extra` multi-byte tokens; then one special token (never
// allowed), the stop token, and 3 ids with no bytes (as a model's padded vocabulary has).
inline std::shared_ptr<const Vocabulary> SmallVocabulary(const std::vector<std::string>& extra,
                                                         int32_t* stop_id = nullptr) {
  std::vector<std::string> bytes;
  std::vector<uint8_t> text;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b))), text.push_back(1);
  for (const std::string& e : extra) bytes.push_back(e), text.push_back(1);
  bytes.push_back("<special>"), text.push_back(0);
  const int32_t stop = static_cast<int32_t>(bytes.size());
  bytes.push_back("</s>"), text.push_back(0);
  if (stop_id) *stop_id = stop;
  auto v = Vocabulary::Create(bytes, text, {stop}, static_cast<int64_t>(bytes.size()) + 3);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.value();
}

// Tokens typical of JSON text and code, for the small vocabulary.
inline std::vector<std::string> JsonishTokens() {
  return {"{\"", "\":", "\",", "\"}", "\": \"", "\"]", "[\"", "},", "}]", "],", ", ", ": ", "  ", "    ",
          "\n", "\n  ", "true", "false", "null", "tr", "ue", "12", "345", "0.", ".5", "e+", "-1", "ab",
          "abc", "name", "age", "\\\"", "\\n", "\\u00", "é", "\xC3", "\xA9x", "日本", "\xE6\x97", "\xA5",
          "()", "((", "))", ")(", "(()", "a)", "x\"", "\"x", "\"\"", "{}", "[]", "[{", "}}", "]]", "\": {",
          "\": [", "\": 1", "1,", "1}", "\"a\"", "\"b\"", "\"c\""};
}

// The id of the text token spelled `bytes` (-1 when absent).
inline int32_t FindToken(const Vocabulary& v, std::string_view bytes) {
  for (int32_t id = 0; id < v.size(); ++id)
    if (v.is_text(id) && v.bytes(id) == bytes) return id;
  return -1;
}

// The mask must equal, token by token, what the matcher would accept.
inline void ExpectMaskMatchesDefinition(GrammarMatcher& m, const std::string& where) {
  const Vocabulary& v = m.grammar().vocabulary();
  std::vector<uint32_t> mask(static_cast<size_t>(v.mask_words()));
  m.FillNextTokenBitmask(mask.data());
  for (int32_t id = 0; id < v.size(); ++id) {
    const bool allowed = m.IsTokenAllowed(id);
    ASSERT_EQ(MaskAllows(mask.data(), id), allowed)
        << where << ": token " << id << " '" << std::string(v.bytes(id)) << "'";
  }
}

}  // namespace pdserve::grammar::testing
