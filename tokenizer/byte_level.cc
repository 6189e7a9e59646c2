#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {

namespace {
struct Tables {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int16_t, 324> char_to_byte{};  // every alphabet character is < U+0144
};

const Tables& GetTables() {
  static const Tables tables = [] {
    Tables t;
    t.char_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next_extra++);
      t.byte_to_char[b] = c;
      t.char_to_byte[c] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}
}  // namespace

char32_t ByteToChar(uint8_t b) { return GetTables().byte_to_char[b]; }

std::optional<uint8_t> CharToByte(char32_t cp) {
  const auto& t = GetTables();
  if (cp >= t.char_to_byte.size() || t.char_to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(t.char_to_byte[cp]);
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToChar(static_cast<uint8_t>(c)), &out);
  return out;
}

std::optional<std::string> ByteLevelToBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const auto b = CharToByte(DecodeUtf8Char(text, &pos));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

}  // namespace pdserve::tokenizer
