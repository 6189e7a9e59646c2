#include "tokenizer/utf8.h"

#include <random>

#include <gtest/gtest.h>

namespace pdserve::tokenizer {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, ValidatesWellFormedText) {
  EXPECT_TRUE(ValidateUtf8("").ok());
  EXPECT_TRUE(ValidateUtf8("plain ascii text, long enough for the 8-byte path").ok());
  EXPECT_TRUE(ValidateUtf8("你好 😀 \xF4\x8F\xBF\xBF \xEF\xBB\xBF").ok());
}

TEST(Utf8, RejectsIllFormedTextWithOffset) {
  struct Case {
    std::string text;
    size_t offset;
  };
  const Case cases[] = {
      {"ab\xC0\x80", 2},            // overlong
      {"\xED\xA0\x80", 0},          // surrogate U+D800
      {"xyz\xF4\x90\x80\x80", 3},   // > U+10FFFF
      {"\xF5\x80\x80\x80", 0},      // never a lead byte
      {"ok\x80", 2},                // stray continuation
      {"abcdefgh\xE4\xBD", 8},      // truncated at the end
      {"\xE4\xBDx", 0},             // truncated before ASCII
  };
  for (const Case& c : cases) {
    Status s = ValidateUtf8(c.text);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("offset " + std::to_string(c.offset)), std::string::npos) << s.message();
  }
}

TEST(Utf8, LossyDecodeReplacesMaximalSubparts) {
  EXPECT_EQ(DecodeUtf8Lossy("abc"), "abc");
  EXPECT_EQ(DecodeUtf8Lossy("\xF0\x9F\x98" "A"), kFffd + "A");        // truncated 4-byte
  EXPECT_EQ(DecodeUtf8Lossy("\xE0\x80"), kFffd + kFffd);              // E0 needs A0..BF next
  EXPECT_EQ(DecodeUtf8Lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(DecodeUtf8Lossy("\xF1\x80\x80"), kFffd);                  // cut at the end
  EXPECT_EQ(DecodeUtf8Lossy("\xFF\xE4\xBD\xA0"), kFffd + "你");
  EXPECT_EQ(DecodeUtf8Lossy("\xC3"), kFffd);
}

TEST(Utf8, StreamingEqualsOneShotForEverySplit) {
  std::mt19937 rng(7);
  const std::string alphabet[] = {"a", "\xC3", "\xA9", "\xE4", "\xBD", "\xA0", "\xF0", "\x9F",
                                  "\x98", "\x80", "\xED", "\xA0", "\xFF", "\xF4", "\x8F"};
  for (int round = 0; round < 3000; ++round) {
    std::string bytes;
    const int n = rng() % 12;
    for (int i = 0; i < n; ++i) bytes += alphabet[rng() % std::size(alphabet)];
    const std::string expected = DecodeUtf8Lossy(bytes);
    ASSERT_TRUE(ValidateUtf8(expected).ok());
    // Byte at a time.
    Utf8LossyDecoder d;
    std::string streamed;
    for (char c : bytes) d.Feed(std::string_view(&c, 1), &streamed);
    d.Finish(&streamed);
    ASSERT_EQ(streamed, expected);
    // One random split point.
    const size_t cut = bytes.empty() ? 0 : rng() % bytes.size();
    Utf8LossyDecoder d2;
    std::string two;
    d2.Feed(std::string_view(bytes).substr(0, cut), &two);
    d2.Feed(std::string_view(bytes).substr(cut), &two);
    d2.Finish(&two);
    ASSERT_EQ(two, expected);
  }
}

TEST(Utf8, HoldsBackIncompleteCharacter) {
  Utf8LossyDecoder d;
  std::string out;
  d.Feed("x\xF0\x9F", &out);
  EXPECT_EQ(out, "x");
  EXPECT_EQ(d.pending(), 2u);
  d.Feed("\x98\x80", &out);
  EXPECT_EQ(out, "x😀");
  EXPECT_EQ(d.pending(), 0u);
}

TEST(Utf8, EcmaScriptSpaceSet) {
  for (char32_t c : {0x09, 0x0B, 0x20, 0xA0, 0x2000, 0x200A, 0x3000, 0xFEFF, 0x2028})
    EXPECT_TRUE(IsEcmaScriptSpace(c)) << std::hex << static_cast<uint32_t>(c);
  for (char32_t c : {0x85, 0x200B, 0x180E, 0x41}) EXPECT_FALSE(IsEcmaScriptSpace(c)) << std::hex << static_cast<uint32_t>(c);
}

}  // namespace
}  // namespace pdserve::tokenizer
