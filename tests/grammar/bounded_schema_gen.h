// BoundedSchemaGen: random JSON Schemas of the subset grammar/json_schema.h supports whose
// documents have a bounded length (every string, array and object is bounded), so a random
// model writing under the schema's mask always finishes well within a few hundred tokens:
// nested objects, enums, const, bounded arrays and tuples, anyOf, $ref to $defs, patterns,
// formats, integer bounds. Test-only (the engine's and the router's constrained-output tests).
//
// Thread-safety: one generator per thread.
#pragma once

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdserve::grammar::testing {

class BoundedSchemaGen {
 public:
  using Json = nlohmann::ordered_json;

  explicit BoundedSchemaGen(uint64_t seed) : rng_(seed) {}

  Json Make() {
    defs_ = Json::object();
    n_defs_ = 0;
    Json s = Chance(0.8) ? Object(0) : Value(0);
    if (!defs_.empty()) {
      if (!s.contains("type")) s = Json{{"anyOf", Json::array({s})}};  // no siblings next to $ref / anyOf
      s["$defs"] = defs_;
    }
    return s;
  }

 private:
  bool Chance(double p) { return std::uniform_real_distribution<double>()(rng_) < p; }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  template <typename T>
  const T& Pick(const std::vector<T>& v) { return v[static_cast<size_t>(Int(0, static_cast<int>(v.size()) - 1))]; }

  Json String() {
    static const std::vector<std::string> patterns = {"^[a-z]{2,5}$", "^\\d{3}-\\d{2}$", "^(red|green|blue)$",
                                                      "^[A-F0-9]{4}$", "^v[0-9]{1,2}\\.[0-9]$", "^[a-z]+@[a-z]{1,4}$"};
    static const std::vector<std::string> formats = {"date", "time", "uuid", "ipv4"};
    static const std::vector<std::string> words = {"alpha", "beta", "x\"y", "\xe6\x97\xa5\xe6\x9c\xac", "a b", "",
                                                   "\xc3\xbc", "new\nline", "z"};
    switch (Int(0, 4)) {
      case 0: {
        std::string p = Pick(patterns);
        if (p.find('+') != std::string::npos) p = "^[a-z]{1,6}@[a-z]{1,4}$";  // bounded
        return Json{{"type", "string"}, {"pattern", p}};
      }
      case 1: return Json{{"type", "string"}, {"format", Pick(formats)}};
      case 2: {
        Json e = Json::array();
        for (int i = Int(1, 4); i > 0; --i) e.push_back(Pick(words));
        return Json{{"type", "string"}, {"enum", e}};
      }
      case 3: return Json{{"const", Pick(words)}};
      default: {
        const int lo = Int(0, 3);
        return Json{{"type", "string"}, {"minLength", lo}, {"maxLength", lo + Int(0, 6)}};
      }
    }
  }

  Json Scalar() {
    switch (Int(0, 8)) {
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
      case 7: return Json{{"enum", Json::array({1, "two", nullptr, true, 2.5, Json{{"k", Json::array({1})}}})}};
      default: return Json{{"type", Json::array({"boolean", "null"})}};
    }
  }

  Json Object(int depth) {
    static const std::vector<std::string> names = {"id", "name", "age", "tags", "a b", "value", "items", "meta",
                                                   "kind", "score", "x\"y", "n"};
    Json props = Json::object(), required = Json::array();
    for (int i = Int(1, depth == 0 ? 4 : 3); i > 0; --i) {
      const std::string name = Pick(names);
      if (props.contains(name)) continue;
      props[name] = Value(depth + 1);
      if (Chance(0.6)) required.push_back(name);
    }
    Json s = {{"type", "object"}, {"properties", props}};
    if (!required.empty()) s["required"] = required;
    s["additionalProperties"] = false;
    if (Chance(0.2)) s["description"] = "generated";
    return s;
  }

  Json Array(int depth) {
    Json s = {{"type", "array"}};
    int prefix = 0;
    if (Chance(0.25)) {
      Json p = Json::array();
      for (prefix = Int(1, 2); static_cast<int>(p.size()) < prefix;) p.push_back(Value(depth + 1));
      s["prefixItems"] = p;
      s["items"] = false;
    } else {
      s["items"] = Value(depth + 1);
    }
    const int lo = Int(0, prefix > 0 ? prefix : 2);
    if (Chance(0.6)) s["minItems"] = lo;
    if (prefix == 0) s["maxItems"] = lo + Int(0, 2);
    return s;
  }

  Json Value(int depth) {
    if (depth >= 3) return Scalar();
    const int k = Int(0, 15);
    if (k < 6) return Scalar();
    if (k < 8) return Object(depth);
    if (k < 11) return Array(depth);
    if (k < 13) {
      Json alts = Json::array();
      for (int i = Int(2, 3); i > 0; --i) alts.push_back(Chance(0.6) ? Scalar() : Value(depth + 1));
      return Json{{"anyOf", alts}};
    }
    const std::string name = "d" + std::to_string(n_defs_++);
    defs_[name] = Value(depth + 1);
    return Json{{"$ref", "#/$defs/" + name}};
  }

  std::mt19937_64 rng_;
  Json defs_;
  int n_defs_ = 0;
};

}  // namespace pdserve::grammar::testing
