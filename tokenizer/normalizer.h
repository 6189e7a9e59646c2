// Normalizer: rewrites the text between added tokens before pre-tokenization, as
// tokenizer.json's "normalizer" declares. Supported types (anything else is Unimplemented at
// load, so a tokenizer is never run with a silently skipped step):
//   Sequence  children in order (an empty Sequence, DeepSeek's case, is dropped entirely)
//   Replace   literal or regex pattern -> literal content
//   Prepend   prefix for non-empty text
//   Strip     left/right whitespace (ECMAScript whitespace set)
// Unicode normalization forms (NFC, NFKC, ...) and Lowercase are not implemented: they need
// Unicode tables this module does not carry.
//
// Thread-safety: immutable after FromJson(); Apply() may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "tokenizer/regex.h"

namespace pdserve::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;

  // Rewrites *text in place. REQUIRES: valid UTF-8 (the result is valid UTF-8 too).
  // Errors: ResourceExhausted when a regex hits a PCRE2 limit.
  virtual Status Apply(std::string* text) const = 0;

  // Builds the normalizer for a tokenizer.json "normalizer" value; returns nullptr when it does
  // nothing (null, empty Sequence). Errors: InvalidArgument, Unimplemented.
  static Result<std::unique_ptr<Normalizer>> FromJson(const nlohmann::json& config,
                                                      RegexDialect dialect);
};

}  // namespace pdserve::tokenizer
