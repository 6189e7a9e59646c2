// Regex: a compiled PCRE2 pattern (UTF mode, JIT when available) used by the Split
// pre-tokenizer, the ByteLevel pre-tokenizer's GPT-2 split and the Replace normalizer.
//
// tokenizer.json patterns are written for the Rust tokenizers library (Oniguruma) and are run
// by the JS reference as ECMAScript `u` regexes. The dialects disagree on a few classes, so a
// pattern is compiled for one of two dialects:
//   kEcmaScript  (default) exactly the JS `u`-flag meaning: \d \w \b are ASCII, \s is the
//                ECMAScript WhiteSpace + LineTerminator set (includes U+FEFF, excludes U+0085).
//                \s/\S are rewritten to that explicit class; PCRE2_UCP stays off so \d \w \b
//                keep their ASCII meaning.
//   kUnicode     PCRE2_UCP: \d \w \s \b use Unicode properties, as Oniguruma does.
// Both accept JS-style \uXXXX and \u{X} escapes (rewritten to \x{...}).
//
// Thread-safety: immutable after Compile(); Find() may be called from any thread (match
// scratch space is per thread).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve::tokenizer {

enum class RegexDialect { kEcmaScript, kUnicode };

class Regex {
 public:
  // Errors: InvalidArgument with PCRE2's message and offset for a bad pattern; Unimplemented
  // for constructs the dialect rewrite cannot express (\S inside a character class).
  static Result<std::unique_ptr<Regex>> Compile(std::string_view pattern, RegexDialect dialect);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the leftmost match in `subject` starting at or after byte `start`.
  // REQUIRES: subject is valid UTF-8 and `start` is a character boundary.
  // Returns true and sets [*begin, *end) on a match; false when there is none. On a matching
  // error (e.g. a resource limit) returns false and sets *error.
  bool Find(std::string_view subject, size_t start, size_t* begin, size_t* end,
            Status* error) const;

  const std::string& pattern() const { return pattern_; }

  // The pattern text after the dialect rewrite (what PCRE2 compiles); exposed for tests.
  static Result<std::string> Translate(std::string_view pattern, RegexDialect dialect);

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace pdserve::tokenizer
