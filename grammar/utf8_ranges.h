// UTF-8 helpers for the grammar compiler: encoding and decoding one character, and turning a
// range of Unicode scalar values into the byte-range sequences that match exactly the UTF-8
// encodings of the characters in it (so a character set compiles to a byte automaton).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace pdserve::grammar {

// Appends the UTF-8 encoding of `cp`. REQUIRES: cp <= kMaxCodepoint and not a surrogate.
void AppendUtf8(uint32_t cp, std::string* out);

// Decodes the first character of `s`: its length in bytes (1..4) and *cp, or 0 when `s`
// does not start with a complete, valid, shortest-form UTF-8 character.
int DecodeUtf8(std::string_view s, uint32_t* cp);

// One byte range per byte of the encoding; a character matches when byte i is in ranges[i].
using Utf8Sequence = std::vector<ByteRange>;

// The sequences whose union is exactly the encodings of [r.lo, r.hi].
// REQUIRES: r.lo <= r.hi <= kMaxCodepoint and r holds no surrogate (NormalizeCharRanges).
std::vector<Utf8Sequence> Utf8Sequences(CharRange r);

}  // namespace pdserve::grammar
