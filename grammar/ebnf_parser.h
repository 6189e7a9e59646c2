// pdserve's EBNF: the text form of a Grammar (the `ebnf` constraint, and Grammar::ToEbnf()).
//
//   # a comment runs to the end of the line
//   root   ::= "{" ws pair ("," ws pair)* "}"      # the rule named root is the start
//   pair   ::= [a-z_]+ ":" ws value                # (else the first rule is)
//   value  ::= %json {"type": "integer"} | "null"  # a JSON Schema embedded as an expression
//   ws     ::= [ \t\n]{0,4}
//
// Expressions: "literal" or 'literal' (escapes \n \r \t \\ \" \' \xHH \uHHHH \UHHHHHHHH, all
// denoting characters, written as UTF-8); [a-z0-9] and [^...] Unicode character classes;
// `.` any character; %xHH and %xHH-HH single raw bytes; rule names ([A-Za-z_][A-Za-z0-9_-]*);
// ( ... ) grouping; | alternation; postfix * + ? {n} {n,} {n,m}; %json <schema> (a JSON Schema
// value, json_schema.h); %regex "pattern" (regex_parser.h, whole-match); %until "marker" (any
// bytes up to and including the first occurrence of the marker). A rule ends where the
// next `name ::=` begins. Rules may be recursive but not left-recursive (compile error).
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace pdserve::grammar {

struct EbnfOptions {
  JsonSchemaOptions json;  // for %json
};

// Errors: InvalidArgument with line:column (syntax, repetition counts above 10000, a rule
// defined twice, an undefined rule, errors of embedded %json / %regex).
Result<Grammar> GrammarFromEbnf(std::string_view text, const EbnfOptions& options = {});

}  // namespace pdserve::grammar
