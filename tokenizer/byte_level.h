// The byte-level alphabet of GPT-2 style BPE: every byte 0..255 is spelled as one printable
// Unicode character, so vocabulary entries are text even when they hold partial UTF-8.
// Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100.. in byte order.
//
// Thread-safety: immutable tables; every function may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pdserve::tokenizer {

// The character that spells byte `b`.
char32_t ByteToChar(uint8_t b);

// The byte a character spells, or nullopt when `cp` is not in the byte-level alphabet.
std::optional<uint8_t> CharToByte(char32_t cp);

// Raw bytes -> byte-level text (UTF-8 of the alphabet characters).
std::string BytesToByteLevel(std::string_view bytes);

// Byte-level text (REQUIRES: valid UTF-8) -> raw bytes; nullopt when a character is outside
// the alphabet.
std::optional<std::string> ByteLevelToBytes(std::string_view text);

}  // namespace pdserve::tokenizer
