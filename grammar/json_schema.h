// JSON Schema -> grammar: the text a model may write is JSON that validates against the schema.
//
// Supported keywords (anything else is refused, see below):
//   type (a name or a list), enum, const, nullable (OpenAPI), anyOf, allOf with one subschema,
//   $ref to "#", "#/$defs/...", "#/definitions/..." or any JSON pointer into the document
//   (recursion allowed), $defs / definitions;
//   objects: properties, required, additionalProperties (false, true or a schema);
//   arrays: items (a schema, or false after prefixItems), prefixItems, minItems, maxItems,
//           uniqueItems: false;
//   strings: minLength, maxLength (<= 5000), pattern (regex_parser.h, unanchored as JSON Schema
//           says), format: date, time, date-time, uuid, email, ipv4, hostname, uri;
//   integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numeric form).
// Annotations are ignored: title, description, default, examples, $schema, $id, $comment,
// deprecated, readOnly, writeOnly and any "x-..." key. A schema `true` or {} allows any value.
//
// Refused with InvalidArgument, the message naming the keyword and its JSON pointer (e.g.
// "json_schema: unsupported keyword 'minProperties' at #/properties/tags"): oneOf, not,
// if/then/else, patternProperties, propertyNames, min/maxProperties, dependent*, unevaluated*,
// contains, uniqueItems: true, multipleOf, number bounds on "number", pattern or format together
// with min/maxLength, allOf with several subschemas, sibling keywords next to anyOf/$ref/allOf,
// draft-4 boolean exclusiveMinimum, a malformed keyword value, a schema that nothing satisfies
// (false, an empty enum, minItems > maxItems, ...).
//
// Output shape: properties in the schema's order (required ones always, optional ones may be
// skipped; extra keys when additionalProperties allows them come after the listed ones and
// never repeat a listed name); numbers with at most 16 integer and 16 fraction digits and a
// 2-digit exponent, integers with at most 18 digits (they fit an int64); whitespace between
// tokens limited to max_whitespace bytes (none in compact mode), so a model cannot pad forever.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "grammar/grammar.h"

namespace pdserve::grammar {

struct JsonSchemaOptions {
  // No whitespace at all between tokens (`{"a":1}`); else up to max_whitespace bytes of
  // [ \t\n\r] in each gap, enough for pretty-printed JSON a few levels deep.
  bool compact = false;
  int32_t max_whitespace = 20;
  // additionalProperties absent means false (OpenAI's strict mode); false: absent means any
  // value under other keys (plain JSON Schema).
  bool strict = true;
  bool operator==(const JsonSchemaOptions&) const = default;
};

// Adds a JSON value constrained by the schema (text) to `g`. `where` prefixes error messages
// (e.g. "tools[2].function.parameters"); `rule_prefix` keeps rule names apart when several
// schemas share a grammar. Errors: InvalidArgument as listed above, or for schema text that is
// not JSON.
Result<ExprId> AddJsonSchema(Grammar* g, std::string_view schema_json, const JsonSchemaOptions& options,
                             std::string_view where = "", std::string_view rule_prefix = "");

// Checks a schema on its own (the router's 400 before anything compiles). Same errors as
// AddJsonSchema, prefixed with `where` (e.g. "tools[1].function.parameters").
Status ValidateJsonSchema(std::string_view schema_json, std::string_view where = "",
                          const JsonSchemaOptions& options = {});

// A grammar for a whole response: optional whitespace, the value, optional whitespace.
Result<Grammar> GrammarFromJsonSchema(std::string_view schema_json, const JsonSchemaOptions& options = {});

// Any JSON object (response_format {"type": "json_object"}), with the same output shape rules.
Grammar GrammarForJsonObject(const JsonSchemaOptions& options = {});

}  // namespace pdserve::grammar
