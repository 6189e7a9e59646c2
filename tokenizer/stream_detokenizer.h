// StreamDetokenizer: turns generated ids into text incrementally for streaming responses.
//
// Byte-level tokens often carry only part of a UTF-8 character (a CJK character or an emoji
// can span two or three tokens). Each Push() returns only text that is final: bytes of an
// incomplete character are held back until the tokens that complete it arrive, so a client
// never sees a broken character or a U+FFFD that a later token would have repaired. Bytes that
// can no longer become a valid character are emitted as U+FFFD at once, exactly as a one-shot
// Decode() would. The concatenation of every Push() plus Finish() always equals
// Decode(all ids).
//
// Thread-safety: one detokenizer per sequence; not for concurrent use. The Tokenizer must
// outlive it.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {

class StreamDetokenizer {
 public:
  explicit StreamDetokenizer(const Tokenizer& tokenizer, const DecodeOptions& options = {})
      : tokenizer_(tokenizer), options_(options) {}

  // Consumes one id and returns the text it completes (often empty for partial characters).
  // Errors: InvalidArgument for an id outside the vocabulary (the state is unchanged, so the
  // caller may continue with other ids).
  Result<std::string> Push(int32_t id);

  // Ends the stream: returns U+FFFD for a dangling incomplete character (or "") and resets.
  std::string Finish();

  // True when bytes of an incomplete character are held back.
  bool has_pending() const { return decoder_.pending() > 0; }
  int64_t tokens_seen() const { return tokens_seen_; }

 private:
  const Tokenizer& tokenizer_;
  DecodeOptions options_;
  Utf8LossyDecoder decoder_;
  int64_t tokens_seen_ = 0;
};

}  // namespace pdserve::tokenizer
