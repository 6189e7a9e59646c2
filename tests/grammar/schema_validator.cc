#include "tests/grammar/schema_validator.h"

#include <cmath>
#include <regex>
#include <set>
#include <vector>

namespace pdserve::grammar::testing {

namespace {

using Json = nlohmann::ordered_json;

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool InRange(const std::string& digits, int lo, int hi) {
  const int v = std::stoi(digits);
  return v >= lo && v <= hi;
}

// Format checks written apart from the grammar's own format regexes.
bool FormatOk(const std::string& format, const std::string& s) {
  std::smatch m;
  if (format == "date" || format == "date-time") {
    static const std::regex date(R"((\d\d\d\d)-(\d\d)-(\d\d))");
    const std::string d = s.substr(0, 10);
    if (!std::regex_match(d, m, date) || !InRange(m[2], 1, 12) || !InRange(m[3], 1, 31)) return false;
    if (format == "date") return s.size() == 10;
    return s.size() > 11 && s[10] == 'T' && FormatOk("time", s.substr(11));
  }
  if (format == "time") {
    static const std::regex time(R"((\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-](\d\d):(\d\d)))");
    return std::regex_match(s, m, time) && InRange(m[1], 0, 23) && InRange(m[2], 0, 59) && InRange(m[3], 0, 60) &&
           (m[5] == "Z" || (InRange(m[6], 0, 23) && InRange(m[7], 0, 59)));
  }
  if (format == "uuid") {
    static const std::regex uuid("[[:xdigit:]]{8}(-[[:xdigit:]]{4}){3}-[[:xdigit:]]{12}");
    return std::regex_match(s, uuid);
  }
  if (format == "email") {
    const size_t at = s.find('@');
    return at != std::string::npos && at > 0 && s.find('@', at + 1) == std::string::npos &&
           s.find('.', at) != std::string::npos && s.back() != '.';
  }
  if (format == "ipv4") {
    static const std::regex ip(R"((\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3}))");
    if (!std::regex_match(s, m, ip)) return false;
    for (int i = 1; i <= 4; ++i)
      if (!InRange(m[i], 0, 255) || (m[i].length() > 1 && m[i].str()[0] == '0')) return false;
    return true;
  }
  if (format == "hostname") {
    static const std::regex host(R"([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*)");
    return std::regex_match(s, host);
  }
  if (format == "uri") {
    static const std::regex uri(R"([A-Za-z][A-Za-z0-9+.\-]*:[^\s]+)");
    return std::regex_match(s, uri);
  }
  return false;
}

class Validator {
 public:
  explicit Validator(const Json& root) : root_(root) {}

  std::string Check(const Json& v, const Json& s, const std::string& path) {
    if (s.is_boolean()) return s.get<bool>() ? "" : path + ": schema false";
    if (auto it = s.find("$ref"); it != s.end()) {
      const std::string r = it->get<std::string>();
      const Json& target = r == "#" ? root_ : root_.at(Json::json_pointer(r.substr(1)));
      return Check(v, target, path);
    }
    if (auto it = s.find("anyOf"); it != s.end()) {
      for (const Json& sub : *it)
        if (Check(v, sub, path).empty()) return "";
      return path + ": no anyOf branch matches";
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      for (const Json& sub : *it)
        if (std::string e = Check(v, sub, path); !e.empty()) return e;
    }
    const bool nullable = s.value("nullable", false);
    if (nullable && v.is_null()) return "";
    if (auto it = s.find("const"); it != s.end() && v != *it) return path + ": not the const";
    if (auto it = s.find("enum"); it != s.end()) {
      bool found = false;
      for (const Json& e : *it) found |= e == v;
      if (!found) return path + ": not in enum";
    }
    if (auto it = s.find("type"); it != s.end()) {
      const Json types = it->is_array() ? *it : Json::array({*it});
      bool ok = false;
      for (const Json& t : types) ok |= TypeIs(v, t.get<std::string>());
      if (!ok) return path + ": wrong type";
    }
    if (v.is_string()) {
      const std::string str = v.get<std::string>();
      if (s.contains("minLength") && CodePoints(str) < s["minLength"].get<size_t>()) return path + ": too short";
      if (s.contains("maxLength") && CodePoints(str) > s["maxLength"].get<size_t>()) return path + ": too long";
      if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript)))
        return path + ": pattern " + s["pattern"].get<std::string>() + " does not match " + str;
      if (s.contains("format") && !FormatOk(s["format"].get<std::string>(), str))
        return path + ": not a " + s["format"].get<std::string>() + ": " + str;
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (s.contains("minimum") && x < s["minimum"].get<double>()) return path + ": below minimum";
      if (s.contains("maximum") && x > s["maximum"].get<double>()) return path + ": above maximum";
      if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return path + ": not above exclusiveMinimum";
      if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return path + ": not below exclusiveMaximum";
    }
    if (v.is_object()) {
      const Json props = s.value("properties", Json::object());
      for (const Json& r : s.value("required", Json::array()))
        if (!v.contains(r.get<std::string>())) return path + ": missing required " + r.get<std::string>();
      for (const auto& [k, val] : v.items()) {
        if (props.contains(k)) {
          if (std::string e = Check(val, props[k], path + "/" + k); !e.empty()) return e;
        } else if (auto ap = s.find("additionalProperties"); ap != s.end()) {
          if (std::string e = Check(val, *ap, path + "/" + k); !e.empty()) return e;
        }
      }
    }
    if (v.is_array()) {
      const size_t n = v.size();
      if (s.contains("minItems") && n < s["minItems"].get<size_t>()) return path + ": too few items";
      if (s.contains("maxItems") && n > s["maxItems"].get<size_t>()) return path + ": too many items";
      const Json prefix = s.value("prefixItems", Json::array());
      for (size_t i = 0; i < n; ++i) {
        const std::string at = path + "/" + std::to_string(i);
        if (i < prefix.size()) {
          if (std::string e = Check(v[i], prefix[i], at); !e.empty()) return e;
        } else if (auto items = s.find("items"); items != s.end()) {
          if (std::string e = Check(v[i], *items, at); !e.empty()) return e;
        }
      }
    }
    return "";
  }

 private:
  static bool TypeIs(const Json& v, const std::string& t) {
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer() || v.is_number_unsigned();
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    return false;
  }

  const Json& root_;
};

}  // namespace

std::string ValidateJson(const Json& value, const Json& schema) { return Validator(schema).Check(value, schema, "#"); }

namespace {
struct DuplicateKeySax : nlohmann::json_sax<nlohmann::json> {
  std::vector<std::set<std::string>> keys;
  bool duplicate = false;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { keys.emplace_back(); return true; }
  bool key(string_t& k) override { duplicate |= !keys.back().insert(k).second; return true; }
  bool end_object() override { keys.pop_back(); return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};
}  // namespace

bool HasDuplicateKeys(const std::string& json_text) {
  DuplicateKeySax sax;
  nlohmann::json::sax_parse(json_text, &sax);
  return sax.duplicate;
}

}  // namespace pdserve::grammar::testing
