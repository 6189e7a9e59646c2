// Regular expressions (ECMAScript syntax, as JSON Schema's "pattern" uses) turned into
// grammar expressions over UTF-8 text.
//
// Supported: literals, `.` (any character but \n \r U+2028 U+2029), classes `[...]` and
// `[^...]` with ranges, \d \D \w \W \s \S (ECMAScript's ASCII \d \w, Unicode \s), escapes \n
// \r \t \f \v \0 \xHH \uHHHH \u{H...} \cX and escaped punctuation, groups `(...)`, `(?:...)`,
// `(?<name>...)`, alternation, quantifiers * + ? {n} {n,} {n,m} (lazy forms match the same
// language), and `^` / `$` at the very start / end of a top-level alternative.
// Refused with InvalidArgument naming the construct and its offset: backreferences,
// lookaround, \b \B, \p{...}, anchors elsewhere, repetition counts above 10000.
//
// Matching is of the whole text; with RegexOptions::search an alternative without `^` may be
// preceded, and one without `$` followed, by any text (JSON Schema's "pattern" semantics).
// With RegexOptions::json_string every character is emitted as it must appear inside a JSON
// string literal: '"', '\' and control characters by their escapes, the rest verbatim.
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "common/status.h"
#include "grammar/grammar.h"

namespace pdserve::grammar {

struct RegexOptions {
  bool search = false;
  bool json_string = false;
};

// Adds the pattern's language to `g` and returns it as one expression.
Result<ExprId> AddRegex(Grammar* g, std::string_view pattern, const RegexOptions& options = {});

// A grammar whose root matches exactly the pattern's language (the `regex` constraint).
Result<Grammar> GrammarFromRegex(std::string_view pattern);

// Emits one character from `ranges` as it appears inside a JSON string (see above).
ExprId JsonStringChars(Grammar* g, const std::vector<CharRange>& ranges);

}  // namespace pdserve::grammar
