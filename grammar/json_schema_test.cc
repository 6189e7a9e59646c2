// JSON Schema front end on hand-picked schemas: which texts each grammar accepts, the output
// shape rules, and the errors that name the keyword and its JSON pointer. The randomized
// 200+-schema test over the real vocabulary is tests/grammar/json_schema_sampling_test.cc.
// To add a case: a row to kSchemas (schema, texts accepted, texts refused) or to the error list.
#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "grammar/testing_util.h"

namespace pdserve::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(const std::string& schema, const JsonSchemaOptions& o = {}) {
  auto g = GrammarFromJsonSchema(schema, o);
  EXPECT_TRUE(g.ok()) << schema << "\n" << g.status().ToString();
  if (!g.ok()) return nullptr;
  auto c = CompiledGrammar::Compile(*g, testing::SmallVocabulary(testing::JsonishTokens()));
  EXPECT_TRUE(c.ok()) << schema << "\n" << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

bool Accepts(const std::shared_ptr<const CompiledGrammar>& c, const std::string& text) {
  GrammarMatcher m(c);
  return m.AcceptBytes(text).ok() && m.CanEnd();
}

struct SchemaCase {
  std::string schema;
  std::vector<std::string> accept, reject;
};

const std::vector<SchemaCase> kSchemas = {
    {R"({"type": "string"})", {R"("")", R"("a\"b\\ \u00e9 \ud83d\ude00 日本")", "\"\x7f\""},
     {R"("a)", "\"a\nb\"", R"("\ud83d")", R"("\x")", "12"}},
    {R"({"type": "integer"})", {"0", "-12", "999999999999999999"}, {"01", "-0x", "1.5", "1e3", "1234567890123456789", "-"}},
    {R"({"type": "number"})", {"0", "-1.25", "3e10", "2.5E-07", "1"}, {"1.", ".5", "1e", "+1", "1e123"}},
    {R"({"type": "integer", "minimum": -15, "exclusiveMaximum": 120})",
     {"-15", "-9", "0", "7", "99", "119"}, {"-16", "-100", "120", "1000"}},
    {R"({"type": "integer", "minimum": 100, "maximum": 100})", {"100"}, {"10", "99", "1000"}},
    {R"({"type": ["boolean", "null"]})", {"true", "false", "null"}, {"0", "\"true\""}},
    {R"({"enum": ["a", 1, null, {"k": [true]}]})", {R"("a")", "1", "null", R"({"k":[true]})"}, {R"("b")", R"({"k": [true]})"}},
    {R"({"const": "fixed"})", {R"("fixed")"}, {R"("other")"}},
    {R"({"type": "string", "minLength": 2, "maxLength": 3})", {R"("ab")", R"("a\nc")", R"("日本語")"}, {R"("a")", R"("abcd")"}},
    {R"({"type": "string", "pattern": "^[a-z]+-\\d{2}$"})", {R"("ab-12")"}, {R"("ab-1")", R"("Ab-12")"}},
    {R"({"type": "string", "pattern": "\\d"})", {R"("x1y")", R"("7")"}, {R"("xy")"}},
    {R"({"type": "string", "format": "date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("24-01-01")"}},
    {R"({"type": "string", "format": "uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"}},
    {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["b"]})",
     {R"({"a": 1, "b": "x"})", R"({"b":"x"})", "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"},
     {R"({"a": 1})", R"({"b": "x", "a": 1})", R"({"b": "x", "c": 1})", R"({})", R"({"a":1,,"b":"x"})"}},
    {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}})",
     {"{}", R"({"b": 2})", R"({"a": 1, "c": 3})", R"({"a":1,"b":2,"c":3})"}, {R"({,"b": 2})", R"({"a": 1,})"}},
    {R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": {"type": "boolean"}})",
     {R"({"id": 1})", R"({"id": 1, "x": true, "idx": false, "i": true})"}, {R"({"id": 1, "id": true})", R"({"id": 1, "x": 2})"}},
    {R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
     {"[1]", "[1, 2, 3]", "[ 1,2 ]"}, {"[]", "[1,2,3,4]", "[1,]"}},
    {R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})",
     {R"([])", R"(["a"])", R"(["a", 1])"}, {R"([1])", R"(["a", 1, 2])"}},
    {R"({"type": "array", "prefixItems": [{"const": 0}], "items": {"type": "boolean"}, "minItems": 2})",
     {"[0, true]", "[0,false,true]"}, {"[0]", "[true]"}},
    {R"({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"]}]})",
     {"5", R"({"x": null})"}, {R"({})", "null"}},
    {R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
          "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
        "$ref": "#/$defs/node"})",
     {R"({"v": 1, "next": null})", R"({"v": 1, "next": {"v": 2, "next": {"v": 3, "next": null}}})"},
     {R"({"v": 1})", R"({"v": 1, "next": {"v": 2}})"}},
    {R"({"type": "object", "properties": {"name": {"type": "string", "nullable": true}}, "required": ["name"]})",
     {R"({"name": null})", R"({"name": "x"})"}, {R"({"name": 1})"}},
    {R"({"allOf": [{"type": "boolean"}], "title": "t", "description": "d", "x-extra": 1})", {"true"}, {"1"}},
    {R"(true)", {"1", R"({"a": [null, {"b": "c"}]})", "[]"}, {"", "{,}"}},
    {R"({})", {"\"s\"", "[1, 2]"}, {"nul"}},
    {R"({"type": "object"})", {"{}", "{ }"}, {R"({"a": 1})"}},
};

TEST(JsonSchema, Languages) {
  for (const SchemaCase& sc : kSchemas) {
    auto c = Compile(sc.schema);
    ASSERT_NE(c, nullptr) << sc.schema;
    for (const std::string& s : sc.accept) EXPECT_TRUE(Accepts(c, s)) << sc.schema << "\n accept: " << s;
    for (const std::string& s : sc.reject) EXPECT_FALSE(Accepts(c, s)) << sc.schema << "\n reject: " << s;
  }
}

TEST(JsonSchema, WhitespaceOptions) {
  const std::string schema = R"({"type": "array", "items": {"type": "integer"}})";
  auto compact = Compile(schema, JsonSchemaOptions{.compact = true});
  EXPECT_TRUE(Accepts(compact, "[1,2]"));
  EXPECT_FALSE(Accepts(compact, "[1, 2]"));
  auto bounded = Compile(schema, JsonSchemaOptions{.max_whitespace = 2});
  EXPECT_TRUE(Accepts(bounded, "[ 1,\n 2]"));
  EXPECT_FALSE(Accepts(bounded, "[1,   2]"));
  auto non_strict = Compile(R"({"type": "object", "properties": {"a": {"type": "integer"}}})",
                            JsonSchemaOptions{.strict = false});
  EXPECT_TRUE(Accepts(non_strict, R"({"a": 1, "b": [true]})"));
  EXPECT_FALSE(Accepts(non_strict, R"({"a": 1, "a": 2})"));
}

TEST(JsonSchema, JsonObjectMode) {
  auto c = CompiledGrammar::Compile(GrammarForJsonObject(), testing::SmallVocabulary({}));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(Accepts(*c, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_TRUE(Accepts(*c, "{}"));
  EXPECT_FALSE(Accepts(*c, "[1]"));
  EXPECT_FALSE(Accepts(*c, "\"s\""));
}

TEST(JsonSchema, ErrorsNameKeywordAndPath) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "object", "properties": {"tags": {"type": "object", "minProperties": 1}}})",
       "unsupported keyword 'minProperties' at #/properties/tags"},
      {R"({"oneOf": [{"type": "string"}]})", "unsupported keyword 'oneOf' at #"},
      {R"({"type": "array", "items": {"not": {"type": "string"}}})", "unsupported keyword 'not' at #/items"},
      {R"({"type": "number", "minimum": 0})", "unsupported keyword 'minimum' on type number"},
      {R"({"type": "number", "multipleOf": 2})", "unsupported keyword 'multipleOf' at #"},
      {R"({"type": "object", "patternProperties": {}})", "unsupported keyword 'patternProperties'"},
      {R"({"type": "array", "uniqueItems": true})", "'uniqueItems': true"},
      {R"({"type": "string", "format": "credit-card"})", "unsupported format 'credit-card' at #/format"},
      {R"({"type": "string", "pattern": "(a", "x": 1})", "unsupported keyword 'x' at #"},
      {R"({"type": "string", "pattern": "(a"})", "regex: missing ')' at offset 2 at #/pattern"},
      {R"({"type": "string", "pattern": "a", "maxLength": 3})", "'pattern' together with minLength/maxLength"},
      {R"({"type": "strin"})", "'type' must name JSON types"},
      {R"({"type": "object", "required": "a"})", "'required' must be a list of strings at #/required"},
      {R"({"type": "array", "minItems": -1})", "'minItems' must be a non-negative integer at #/minItems"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "no array satisfies"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no integer satisfies"},
      {R"({"type": "integer", "minimum": 1, "exclusiveMinimum": true})", "boolean 'exclusiveMinimum'"},
      {R"({"enum": []})", "'enum' must be a non-empty list at #/enum"},
      {R"({"type": "string", "enum": [1, 2]})", "no 'enum' value has the schema's type"},
      {R"({"$ref": "#/$defs/missing"})", "'$ref' target '#/$defs/missing' does not exist"},
      {R"({"$ref": "http://example.com/s.json"})", "only local references"},
      {R"({"$ref": "#/$defs/a", "type": "object", "$defs": {"a": true}})", "keyword 'type' next to '$ref'"},
      {R"({"allOf": [{"type": "string"}, {"minLength": 1}]})", "'allOf' is supported with exactly one subschema"},
      {R"({"type": "object", "properties": {"a": false}})", "schema 'false' allows no value at #/properties/a"},
      {R"({"type": "object", "required": ["z"], "additionalProperties": false})",
       "required property 'z' is not in 'properties' and additionalProperties is false"},
      {R"({"type": "string", "maxLength": 100000})", "maxLength above 5000"},
      {R"({"$defs": [], "type": "null"})", "'$defs' must be an object"},
      {R"({"type": "object", "properties": {"a/b": {"type": "object", "properties": {"c": {"if": {}}}}}})",
       "unsupported keyword 'if' at #/properties/a~1b/properties/c"},
      {R"({"type": "object")", "not valid JSON"},
      {R"([1])", "a schema must be an object or a boolean at #"},
  };
  for (const auto& [schema, want] : cases) {
    auto g = GrammarFromJsonSchema(schema);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(want), std::string::npos) << schema << "\n -> " << g.status().ToString();
  }
  // `where` prefixes the message (e.g. which tool's parameters).
  Grammar g;
  auto e = AddJsonSchema(&g, R"({"not": {}})", {}, "tools[1].function.parameters");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().message().rfind("tools[1].function.parameters: json_schema: unsupported keyword 'not'", 0), 0u)
      << e.status().message();
}

TEST(JsonSchema, ManyOptionalPropertiesStayLinear) {
  // 60 optional properties: the "first member has no comma" chains share their tails.
  std::string schema = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 60; ++i) schema += (i ? ", " : "") + std::string("\"p") + std::to_string(i) + R"(": {"type": "integer"})";
  schema += "}}";
  auto c = Compile(schema);
  ASSERT_NE(c, nullptr);
  // About 110 nodes a property (key, two 20-byte whitespace gaps, an 18-digit integer, the
  // separator); the unshared form would need ~60 * 60 / 2 times that.
  EXPECT_LT(c->n_nodes(), 150 * 60);
  EXPECT_TRUE(Accepts(c, R"({"p3": 1, "p59": 2})"));
  EXPECT_FALSE(Accepts(c, R"({"p59": 2, "p3": 1})"));
}

}  // namespace
}  // namespace pdserve::grammar
