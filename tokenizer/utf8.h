// UTF-8 helpers for the tokenizer: strict validation of input text, and a streaming lossy
// decoder that turns arbitrary bytes (token bytes can split a character) into valid UTF-8.
//
// The lossy decoder follows the WHATWG Encoding Standard's UTF-8 decoder: each maximal
// invalid subpart becomes one U+FFFD. That is what both the JS reference (TextDecoder) and the
// Rust tokenizers library (String::from_utf8_lossy) do, so one-shot and streaming decodes agree
// with them byte for byte.
//
// Thread-safety: free functions are pure; a Utf8LossyDecoder is single-threaded state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve::tokenizer {

// OK when `text` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
// Errors: InvalidArgument naming the byte offset of the first bad sequence.
Status ValidateUtf8(std::string_view text);

// Length in bytes of the well-formed character starting at text[pos], or 0 when the bytes
// there are not one (truncated, overlong, surrogate, stray continuation byte).
size_t Utf8CharLength(std::string_view text, size_t pos);

// Decodes the character at text[*pos] (REQUIRES: well-formed there) and advances *pos.
char32_t DecodeUtf8Char(std::string_view text, size_t* pos);

// True for the characters ECMAScript's \s and String.prototype.trim() treat as whitespace:
// TAB LF VT FF CR, U+0020, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000 and U+FEFF.
bool IsEcmaScriptSpace(char32_t c);

// Appends the UTF-8 encoding of `cp` (REQUIRES: a scalar value) to *out.
void AppendUtf8(char32_t cp, std::string* out);

// Incremental bytes -> valid UTF-8. Feed() may be called with any split of the input; the
// concatenated output always equals DecodeUtf8Lossy(all input).
class Utf8LossyDecoder {
 public:
  // Appends every character completed by `bytes` to *out. A trailing incomplete but still
  // possibly valid sequence is held back until more bytes or Finish() arrive.
  void Feed(std::string_view bytes, std::string* out);
  // Flushes a held incomplete sequence as U+FFFD and resets the state.
  void Finish(std::string* out);
  // Bytes currently held back (0..3).
  size_t pending() const { return held_len_; }

 private:
  void Reset();
  uint8_t needed_ = 0;   // continuation bytes still expected
  uint8_t lower_ = 0x80;  // allowed range of the next continuation byte
  uint8_t upper_ = 0xBF;
  uint8_t held_len_ = 0;
  char held_[4] = {};
};

// One-shot lossy decode (see Utf8LossyDecoder).
std::string DecodeUtf8Lossy(std::string_view bytes);

}  // namespace pdserve::tokenizer
