// 250+ JSON Schemas (generated from seeds: nested objects, enums, bounded arrays, tuples,
// anyOf, $ref to $defs including recursive ones, patterns, formats, integer bounds, nullable
// types, additionalProperties of every kind, plus hand-written realistic ones) compiled over the
// real DeepSeek vocabulary; for each, several generations sampled token by token under the
// mask (random picks biased toward structural tokens so documents finish; one generation per
// schema through random logits + ApplyTokenBitmask + argmax) must give text that parses as JSON,
// has no repeated keys and validates (schema_validator.h).
// To add a case: a schema to kHandWritten, or a new shape to SchemaGen::Value.
#include <chrono>
#include <cmath>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/bitmask.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tests/grammar/deepseek_vocabulary.h"
#include "tests/grammar/schema_validator.h"

namespace pdserve::grammar {
namespace {

using Json = nlohmann::ordered_json;
using testing::DeepSeekVocabulary;

constexpr int kGeneratedSchemas = 240;
constexpr int kSamplesPerSchema = 4;
constexpr int kMaxSteps = 4000;

class SchemaGen {
 public:
  explicit SchemaGen(uint64_t seed) : rng_(seed) {}

  Json Make() {
    defs_ = Json::object();
    n_defs_ = 0;
    Json s = Chance(0.75) ? Object(0) : Value(0);
    if (Chance(0.1)) s = Json{{"$ref", "#/$defs/" + Def(s)}};
    if (!defs_.empty()) {
      if (!s.is_object()) s = Json{{"anyOf", Json::array({s})}};
      s["$defs"] = defs_;
    }
    return s;
  }

 private:
  bool Chance(double p) { return std::uniform_real_distribution<double>()(rng_) < p; }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  template <typename T>
  const T& Pick(const std::vector<T>& v) { return v[static_cast<size_t>(Int(0, static_cast<int>(v.size()) - 1))]; }

  std::string Def(const Json& body) {
    const std::string name = "d" + std::to_string(n_defs_++);
    defs_[name] = body;
    return name;
  }

  Json String() {
    static const std::vector<std::string> patterns = {
        "^[a-z]{3,6}$", "^\\d{3}-\\d{4}$", "^[A-Z][a-z]{1,9}( [A-Z][a-z]{1,9})?$", "^(red|green|blue)$", "^[a-f0-9]{8}$",
        "\\d", "ab", "^v[0-9]{1,3}\\.[0-9]{1,3}$", "[A-Z]{2}", "^\\w{1,8}@\\w{1,8}\\.(com|org)$", "^[a-zA-Z0-9 _-]{2,4}$"};
    static const std::vector<std::string> formats = {"date", "time", "date-time", "uuid", "email", "ipv4",
                                                     "hostname", "uri"};
    static const std::vector<std::string> words = {"alpha", "beta", "x\"y", "日本", "a b", "back\\slash", "", "ü",
                                                   "new\nline", "emoji😀", "tab\t", "z"};
    switch (Int(0, 6)) {
      case 0: return Json{{"type", "string"}, {"pattern", Pick(patterns)}};
      case 1: return Json{{"type", "string"}, {"format", Pick(formats)}};
      case 2: {
        Json e = Json::array();
        for (int i = Int(1, 5); i > 0; --i) e.push_back(Pick(words));
        return Json{{"type", "string"}, {"enum", e}};
      }
      case 3: {
        const int lo = Int(0, 4);
        return Json{{"type", "string"}, {"minLength", lo}, {"maxLength", lo + Int(0, 12)}};
      }
      case 4: return Json{{"const", Pick(words)}};
      default: return Json{{"type", "string"}};
    }
  }

  Json Scalar() {
    switch (Int(0, 9)) {
      case 0:
      case 1:
      case 2: return String();
      case 3: return Json{{"type", "integer"}};
      case 4: {
        const int lo = Int(-300, 300);
        Json s = {{"type", "integer"}, {Chance(0.5) ? "minimum" : "exclusiveMinimum", lo}};
        if (Chance(0.7)) s[Chance(0.5) ? "maximum" : "exclusiveMaximum"] = lo + Int(2, 5000);
        return s;
      }
      case 5: return Json{{"type", "number"}};
      case 6: return Json{{"type", "boolean"}};
      case 7: return Json{{"type", Json::array({Pick(std::vector<std::string>{"string", "integer", "boolean"}), "null"})}};
      case 8: return Json{{"enum", Json::array({1, "two", nullptr, true, 2.5, Json{{"k", Json::array({1})}}})}};
      default: return Json{{"type", "string"}, {"nullable", true}};
    }
  }

  Json Object(int depth) {
    static const std::vector<std::string> names = {"id", "name", "age", "tags", "a b", "ключ", "x\"y", "value",
                                                   "items", "meta", "kind", "score", "when", "url", "note", "n"};
    Json props = Json::object(), required = Json::array();
    for (int i = Int(depth > 2 ? 0 : 1, 6); i > 0; --i) {
      const std::string name = Pick(names);
      if (props.contains(name)) continue;
      props[name] = Value(depth + 1);
      if (Chance(0.6)) required.push_back(name);
    }
    Json s = {{"type", "object"}, {"properties", props}};
    if (!required.empty()) s["required"] = required;
    const int ap = Int(0, 9);
    if (ap < 5) s["additionalProperties"] = false;
    else if (ap == 5) s["additionalProperties"] = true;
    else if (ap < 8) s["additionalProperties"] = Scalar();
    if (Chance(0.3)) s["description"] = "generated";
    return s;
  }

  Json Array(int depth) {
    Json s = {{"type", "array"}};
    if (Chance(0.2)) {
      Json prefix = Json::array();
      for (int i = Int(1, 3); i > 0; --i) prefix.push_back(Value(depth + 1));
      s["prefixItems"] = prefix;
      s["items"] = Chance(0.5) ? Json(false) : Value(depth + 1);
    } else {
      s["items"] = Value(depth + 1);
    }
    if (Chance(0.6)) {
      int lo = Int(0, 2);
      if (s["items"] == Json(false)) lo = std::min<int>(lo, static_cast<int>(s["prefixItems"].size()));
      s["minItems"] = lo;
      if (Chance(0.7)) s["maxItems"] = lo + Int(0, 3);
    }
    return s;
  }

  Json Value(int depth) {
    if (depth >= 4) return Scalar();
    const int k = Int(0, 19);
    if (k < 7) return Scalar();
    if (k < 10) return Object(depth);
    if (k < 13) return Array(depth);
    if (k < 15) {
      Json alts = Json::array();
      for (int i = Int(2, 3); i > 0; --i) alts.push_back(Chance(0.5) ? Scalar() : Value(depth + 1));
      return Json{{"anyOf", alts}};
    }
    if (k < 17) {
      const std::string name = Def(Value(depth + 1));
      return Json{{"$ref", "#/$defs/" + name}};
    }
    if (k < 18 && !defs_.contains("node")) {
      defs_["node"] = Json{{"type", "object"},
                           {"properties", {{"value", Scalar()},
                                           {"children", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}},
                                                         {"maxItems", 2}}}}},
                           {"required", Json::array({"value"})},
                           {"additionalProperties", false}};
      return Json{{"$ref", "#/$defs/node"}};
    }
    if (k < 19) return Json(true);  // any JSON value
    return Json{{"type", "array"}, {"items", Json{{"type", "array"}, {"items", Scalar()}, {"maxItems", 3}}}, {"maxItems", 3}};
  }

  std::mt19937_64 rng_;
  Json defs_;
  int n_defs_ = 0;
};

const std::vector<std::string> kHandWritten = {
    // An order, as an application would ask for one.
    R"({"type": "object", "properties": {
        "order_id": {"type": "string", "format": "uuid"},
        "customer": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 40},
            "email": {"type": "string", "format": "email"}, "vip": {"type": "boolean"}},
            "required": ["name", "email"], "additionalProperties": false},
        "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 99},
            "price": {"type": "number"}}, "required": ["sku", "qty", "price"], "additionalProperties": false}},
        "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
        "placed_at": {"type": "string", "format": "date-time"},
        "notes": {"type": ["string", "null"]}},
      "required": ["order_id", "customer", "items", "status"], "additionalProperties": false})",
    // A function's parameters, OpenAI style.
    R"({"type": "object", "properties": {"location": {"type": "string", "description": "City"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["location"], "additionalProperties": false})",
    // Pydantic-style output with $defs and a nullable reference.
    R"({"$defs": {"Address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string",
        "pattern": "^\\d{5}$"}}, "required": ["street", "zip"], "title": "Address"}},
        "type": "object", "properties": {"name": {"title": "Name", "type": "string"},
        "home": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
        "work": {"allOf": [{"$ref": "#/$defs/Address"}]}}, "required": ["name", "home"]})",
    // A recursive tree.
    R"({"$defs": {"t": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 8},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 3}}, "required": ["label", "kids"]}},
        "$ref": "#/$defs/t"})",
    // Self-reference through "#".
    R"({"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["v", "next"]})",
    // A tuple and free-form extras.
    R"({"type": "object", "properties": {"point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
        "items": false, "minItems": 2}}, "required": ["point"], "additionalProperties": true})",
    R"({"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 2})",
    R"(true)",
    R"({"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}})",
};

// Unanchored patterns are ones a random walk meets soon (a digit, "ab", two capitals), and
// repetitions inside patterns are bounded: the picker below knows nothing about the pattern
// (a real model would), so it relies on the mask running out of other choices.
// Picks the next token from `mask`: mostly uniform over the allowed ids, with a bias toward
// tokens holding JSON punctuation so generations finish: early on any structural token; after
// 150 steps, a quote inside a string (it ends the string), else a closing bracket or the stop
// token, else a quote (a short string rather than a new container).
class BiasedPicker {
 public:
  explicit BiasedPicker(const Vocabulary& v) : v_(v) {
    for (int32_t id = 0; id < v.size(); ++id) {
      const std::string_view b = v.bytes(id);
      if (!v.is_text(id)) continue;
      if (b.find_first_of("\"{}[],:") != std::string_view::npos) structural_.push_back(id);
      if (b.find('"') != std::string_view::npos) quote_.push_back(id);
      bool escaped = false;  // read inside a string: does it hold a closing quote?
      for (char ch : b) {
        if (escaped) escaped = false;
        else if (ch == '\\') escaped = true;
        else if (ch == '"') {
          end_string_.push_back(id);
          break;
        }
      }
      const size_t first = b.find_first_not_of(" \t\n\r");
      if (first != std::string_view::npos && (b[first] == ']' || b[first] == '}')) close_.push_back(id);
    }
    for (int32_t id : v.stop_ids()) structural_.push_back(id), close_.push_back(id);
  }

  // The preferred lists for this step, best first.
  std::vector<const std::vector<int32_t>*> Preferred(int step, bool in_string) const {
    if (step < 150) return {&structural_};
    if (in_string) return {&end_string_};
    return {&close_, &quote_};
  }

  int32_t Pick(const uint32_t* mask, int step, bool in_string, std::mt19937_64& rng) {
    const double p_prefer = step < 40 ? 0.25 : step < 150 ? 0.5 : 0.9;
    if (std::uniform_real_distribution<double>()(rng) < p_prefer) {
      for (const std::vector<int32_t>* list : Preferred(step, in_string)) {
        std::vector<int32_t>& allowed = scratch_;
        allowed.clear();
        for (int32_t id : *list)
          if (MaskAllows(mask, id)) allowed.push_back(id);
        if (!allowed.empty()) return allowed[rng() % allowed.size()];
      }
    }
    for (int tries = 0; tries < 64; ++tries) {  // rejection sampling: cheap when most ids fit
      const int32_t id = static_cast<int32_t>(rng() % static_cast<uint64_t>(v_.size()));
      if (MaskAllows(mask, id)) return id;
    }
    std::vector<int32_t>& allowed = scratch_;
    allowed.clear();
    for (int32_t id = 0; id < v_.size(); ++id)
      if (MaskAllows(mask, id)) allowed.push_back(id);
    return allowed.empty() ? -1 : allowed[rng() % allowed.size()];
  }

  // Random logits (uniform noise in [0, 1); the preferred lists +1 / +0.5 on some steps),
  // masked with ApplyTokenBitmask and argmaxed.
  int32_t PickByLogits(const uint32_t* mask, int step, bool in_string, std::mt19937_64& rng, std::vector<float>* logits) {
    logits->resize(static_cast<size_t>(v_.size()));
    uint64_t x = rng() | 1;
    for (float& l : *logits) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      l = static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
    }
    if (step >= 150 || rng() % 3 == 0) {
      float bonus = 1.0f;
      for (const std::vector<int32_t>* list : Preferred(step, in_string)) {
        for (int32_t id : *list) (*logits)[static_cast<size_t>(id)] += bonus;
        bonus *= 0.5f;
      }
    }
    ApplyTokenBitmask(logits->data(), v_.size(), mask);
    const auto best = std::max_element(logits->begin(), logits->end());
    if (std::isinf(*best)) return -1;
    return static_cast<int32_t>(best - logits->begin());
  }

 private:
  const Vocabulary& v_;
  std::vector<int32_t> structural_, quote_, end_string_, close_, scratch_;
};

// Whether JSON text ends inside a string literal.
class StringTracker {
 public:
  void Add(std::string_view bytes) {
    for (char c : bytes) {
      if (escaped_) escaped_ = false;
      else if (in_string_ && c == '\\') escaped_ = true;
      else if (c == '"') in_string_ = !in_string_;
    }
  }
  bool in_string() const { return in_string_; }

 private:
  bool in_string_ = false, escaped_ = false;
};

struct Outcome {
  int64_t samples = 0, tokens = 0;
  double mask_seconds = 0;
};

// Generates one document under the mask and checks it. Returns false (with a failure) if not.
void SampleAndCheck(const std::shared_ptr<const CompiledGrammar>& c, const Json& schema, uint64_t seed, bool by_logits,
                    BiasedPicker& picker, Outcome* out, const std::string& label) {
  const Vocabulary& v = c->vocabulary();
  GrammarMatcher m(c);
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(static_cast<size_t>(v.mask_words()));
  std::vector<float> logits;
  std::string text;
  StringTracker strings;
  int step = 0;
  for (; step < kMaxSteps && !m.IsTerminated(); ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool any = m.FillNextTokenBitmask(mask.data());
    out->mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(any) << label << ": nothing allowed after '" << text << "'";
    const int32_t id = by_logits ? picker.PickByLogits(mask.data(), step, strings.in_string(), rng, &logits)
                                 : picker.Pick(mask.data(), step, strings.in_string(), rng);
    ASSERT_GE(id, 0) << label;
    const Status s = m.AcceptToken(id);
    ASSERT_TRUE(s.ok()) << label << ": the mask allowed token " << id << " but AcceptToken says " << s.ToString();
    if (!v.is_stop(id)) text += v.bytes(id), strings.Add(v.bytes(id));
  }
  ASSERT_TRUE(m.IsTerminated()) << label << ": no end after " << kMaxSteps << " steps; schema " << schema.dump()
                                << "\noutput ends: " << text.substr(text.size() > 600 ? text.size() - 600 : 0);
  Json value;
  try {
    value = Json::parse(text);
  } catch (const std::exception& e) {
    FAIL() << label << ": output is not JSON (" << e.what() << "):\n" << text;
  }
  ASSERT_FALSE(testing::HasDuplicateKeys(text)) << label << ": repeated key in\n" << text;
  const std::string why = testing::ValidateJson(value, schema);
  ASSERT_TRUE(why.empty()) << label << ": " << why << "\nschema: " << schema.dump() << "\noutput: " << text;
  ++out->samples;
  out->tokens += step;
}

void RunSchemas(const std::vector<Json>& schemas, const std::string& tag) {
  auto vocab = DeepSeekVocabulary();
  ASSERT_NE(vocab, nullptr);
  BiasedPicker picker(*vocab);
  Outcome outcome;
  double compile_seconds = 0;
  int64_t nodes = 0, classified = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    const std::string label = tag + " schema " + std::to_string(i);
    const auto t0 = std::chrono::steady_clock::now();
    auto g = GrammarFromJsonSchema(schemas[i].dump());
    ASSERT_TRUE(g.ok()) << label << ": " << g.status().ToString() << "\n" << schemas[i].dump();
    auto c = CompiledGrammar::Compile(*g, vocab);
    ASSERT_TRUE(c.ok()) << label << ": " << c.status().ToString() << "\n" << schemas[i].dump();
    compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    nodes += (*c)->n_nodes();
    for (int k = 0; k < kSamplesPerSchema; ++k) {
      SampleAndCheck(*c, schemas[i], i * 1000 + static_cast<uint64_t>(k), /*by_logits=*/k == 0, picker, &outcome,
                     label + " sample " + std::to_string(k));
      if (::testing::Test::HasFatalFailure()) return;
    }
    classified += (*c)->nodes_classified();
  }
  std::printf("%s: %zu schemas, %lld documents, %lld tokens; compile %.2f s, masks %.2f s (%.1f us/token incl. first-use "
              "classification of %lld of %lld nodes)\n",
              tag.c_str(), schemas.size(), static_cast<long long>(outcome.samples), static_cast<long long>(outcome.tokens),
              compile_seconds, outcome.mask_seconds, 1e6 * outcome.mask_seconds / std::max<int64_t>(1, outcome.tokens),
              static_cast<long long>(classified), static_cast<long long>(nodes));
}

TEST(JsonSchemaSampling, GeneratedSchemasValidate) {
  std::vector<Json> schemas;
  for (int i = 0; i < kGeneratedSchemas; ++i) schemas.push_back(SchemaGen(1000 + static_cast<uint64_t>(i)).Make());
  RunSchemas(schemas, "generated");
}

TEST(JsonSchemaSampling, HandWrittenSchemasValidate) {
  std::vector<Json> schemas;
  for (const std::string& s : kHandWritten) schemas.push_back(Json::parse(s));
  RunSchemas(schemas, "hand-written");
}

TEST(JsonSchemaSampling, JsonObjectModeGivesObjects) {
  auto vocab = DeepSeekVocabulary();
  ASSERT_NE(vocab, nullptr);
  auto c = CompiledGrammar::Compile(GrammarForJsonObject(), vocab);
  ASSERT_TRUE(c.ok());
  BiasedPicker picker(*vocab);
  Outcome outcome;
  const Json object_schema = {{"type", "object"}, {"additionalProperties", true}};
  for (uint64_t seed = 0; seed < 12; ++seed) {
    SampleAndCheck(*c, object_schema, seed, seed % 3 == 0, picker, &outcome, "json_object seed " + std::to_string(seed));
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace pdserve::grammar
