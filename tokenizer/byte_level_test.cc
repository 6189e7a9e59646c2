#include "tokenizer/byte_level.h"

#include <set>

#include <gtest/gtest.h>

namespace pdserve::tokenizer {
namespace {

TEST(ByteLevel, AlphabetIsABijection) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = ByteToChar(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(c).second);
    ASSERT_EQ(CharToByte(c), static_cast<uint8_t>(b));
  }
  EXPECT_EQ(ByteToChar(' '), U'\u0120');   // Ġ
  EXPECT_EQ(ByteToChar('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(ByteToChar('A'), U'A');
  EXPECT_EQ(ByteToChar(0xAD), U'\u0143');  // soft hyphen is remapped (last extra char)
  EXPECT_FALSE(CharToByte(U'\u0144').has_value());
  EXPECT_FALSE(CharToByte(U'你').has_value());
}

TEST(ByteLevel, RoundTripsBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = BytesToByteLevel(all);
  EXPECT_EQ(ByteLevelToBytes(spelled), all);
  EXPECT_EQ(BytesToByteLevel(" hello"), "\xC4\xA0hello");
  EXPECT_FALSE(ByteLevelToBytes("你").has_value());
}

}  // namespace
}  // namespace pdserve::tokenizer
