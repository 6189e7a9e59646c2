#include "grammar/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "grammar/regex_parser.h"
#include "grammar/utf8_ranges.h"

namespace pdserve::grammar {

namespace {

using Json = nlohmann::ordered_json;

constexpr int32_t kMaxStringLength = 5000;
constexpr int kMaxSchemaDepth = 64;
constexpr int64_t kMaxIntegerMagnitude = 999'999'999'999'999'999;  // 18 digits

const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {"title",    "description", "default",  "examples", "$schema",
                                          "$id",      "$comment",    "deprecated", "readOnly", "writeOnly"};
  return k;
}
const std::set<std::string>& Supported() {
  static const std::set<std::string> k = {
      "type",  "enum",  "const",       "nullable",  "anyOf",          "allOf",       "$ref",      "$defs",
      "definitions", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
      "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
      "exclusiveMinimum", "exclusiveMaximum"};
  return k;
}
bool IsAnnotation(const std::string& k) { return Annotations().count(k) || k.rfind("x-", 0) == 0; }

// Keywords that only make sense for one type, used to infer the type when "type" is absent.
const std::map<std::string, std::string>& KeywordType() {
  static const std::map<std::string, std::string> k = {
      {"minLength", "string"},    {"maxLength", "string"},         {"pattern", "string"},
      {"format", "string"},       {"minimum", "integer"},          {"maximum", "integer"},
      {"exclusiveMinimum", "integer"}, {"exclusiveMaximum", "integer"}, {"properties", "object"},
      {"required", "object"},     {"additionalProperties", "object"}, {"items", "array"},
      {"prefixItems", "array"},   {"minItems", "array"},           {"maxItems", "array"},
      {"uniqueItems", "array"}};
  return k;
}

std::string PointerToken(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// Regexes (over the string's characters) of the supported formats. Approximations that only
// admit valid values (emails are shortened to 32@24 characters, dates do not check the month's
// length); bounded repetitions are kept short since each bound is a chain of automaton nodes.
const std::map<std::string, std::string>& Formats() {
  static const std::map<std::string, std::string> k = {
      {"date", R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))"},
      {"time", R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"date-time", R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
      {"email", R"([A-Za-z0-9._%+-]{1,32}@[A-Za-z0-9-]{1,24}(\.[A-Za-z0-9-]{1,24}){0,3}\.[A-Za-z]{2,12})"},
      {"ipv4", R"(((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))"},
      {"hostname", R"([A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*)"},
      {"uri", R"([A-Za-z][A-Za-z0-9+.-]*:[!#-\[\]-~]+)"},
  };
  return k;
}

// Whitespace allowed in one gap between tokens.
ExprId Whitespace(Grammar* g, const JsonSchemaOptions& o) {
  if (o.compact || o.max_whitespace <= 0) return g->Empty();
  return g->Repeat(g->ByteSet({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}}), 0, o.max_whitespace);
}

class SchemaConverter {
 public:
  SchemaConverter(Grammar* g, const Json& root, const JsonSchemaOptions& o, std::string where, std::string prefix)
      : g_(g), root_(root), o_(o), where_(std::move(where)), prefix_(std::move(prefix)) {}

  Result<ExprId> Convert(const Json& s, const std::string& path, int depth);
  ExprId AnyValue();
  ExprId AnyObject();
  ExprId Ws() { return Whitespace(g_, o_); }

 private:
  Status Error(const std::string& what, const std::string& path) const {
    return Status::InvalidArgument((where_.empty() ? "" : where_ + ": ") + "json_schema: " + what + " at " + path);
  }
  ExprId Sep() { return g_->Seq({Ws(), g_->Bytes(","), Ws()}); }
  ExprId Literal(const Json& v) { return g_->Bytes(v.dump()); }
  ExprId StringUnit();
  ExprId AnyString() { return g_->Seq({g_->Bytes("\""), g_->Star(StringUnit()), g_->Bytes("\"")}); }
  ExprId Number();
  ExprId IntegerRange(int64_t lo, int64_t hi);
  ExprId NonNegativeRange(int64_t lo, int64_t hi);
  ExprId SameLengthRange(const std::string& a, const std::string& b);
  ExprId KeyExcluding(const std::vector<std::string>& names);

  Result<std::optional<int64_t>> Count(const Json& s, const char* key, const std::string& path) const;
  Result<ExprId> Ref(const Json& ref, const std::string& path, int depth);
  Result<ExprId> String(const Json& s, const std::string& path);
  Result<ExprId> Integer(const Json& s, const std::string& path);
  Result<ExprId> Object(const Json& s, const std::string& path, int depth);
  Result<ExprId> Array(const Json& s, const std::string& path, int depth);

  Grammar* g_;
  const Json& root_;
  JsonSchemaOptions o_;
  std::string where_, prefix_;
  std::map<std::string, RuleId> refs_;
  RuleId any_value_ = -1, any_object_ = -1;
  ExprId string_unit_ = -1;
};

ExprId SchemaConverter::StringUnit() {
  if (string_unit_ >= 0) return string_unit_;
  Grammar& g = *g_;
  const ExprId raw = g.CharSet({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}});
  const ExprId hex = g.ByteSet({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
  const ExprId hex2 = g.Seq({hex, hex});
  // \uXXXX outside the surrogates, or a high surrogate escape followed by a low one.
  const ExprId plain = g.Alt({g.Seq({g.ByteSet({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}), hex, hex2}),
                              g.Seq({g.ByteSet({{'d', 'd'}, {'D', 'D'}}), g.ByteSet({{'0', '7'}}), hex2})});
  const ExprId pair = g.Seq({g.ByteSet({{'d', 'd'}, {'D', 'D'}}), g.ByteSet({{'8', '9'}, {'a', 'b'}, {'A', 'B'}}), hex2,
                             g.Bytes("\\u"), g.ByteSet({{'d', 'd'}, {'D', 'D'}}),
                             g.ByteSet({{'c', 'f'}, {'C', 'F'}}), hex2});
  const ExprId escape = g.Seq({g.Bytes("\\"), g.Alt({g.ByteSet({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'},
                                                                 {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                                     g.Seq({g.Bytes("u"), g.Alt({plain, pair})})})});
  string_unit_ = g.Alt({raw, escape});
  return string_unit_;
}

ExprId SchemaConverter::Number() {
  Grammar& g = *g_;
  const ExprId digit = g.ByteSet({{'0', '9'}});
  const ExprId integer = g.Alt({g.Bytes("0"), g.Seq({g.ByteSet({{'1', '9'}}), g.Repeat(digit, 0, 15)})});
  const ExprId fraction = g.Optional(g.Seq({g.Bytes("."), g.Repeat(digit, 1, 16)}));
  const ExprId exponent = g.Optional(g.Seq({g.ByteSet({{'e', 'e'}, {'E', 'E'}}),
                                           g.Optional(g.ByteSet({{'+', '+'}, {'-', '-'}})), g.Repeat(digit, 1, 2)}));
  return g.Seq({g.Optional(g.Bytes("-")), integer, fraction, exponent});
}

// Decimal strings of equal length, a <= b: every string between them.
ExprId SchemaConverter::SameLengthRange(const std::string& a, const std::string& b) {
  Grammar& g = *g_;
  if (a.empty()) return g.Empty();
  if (a == b) return g.Bytes(a);
  const uint8_t a0 = static_cast<uint8_t>(a[0]), b0 = static_cast<uint8_t>(b[0]);
  if (a.size() == 1) return g.ByteSet({{a0, b0}});
  const std::string ra = a.substr(1), rb = b.substr(1);
  if (a0 == b0) return g.Seq({g.Bytes(a.substr(0, 1)), SameLengthRange(ra, rb)});
  const ExprId any_rest = g.Repeat(g.ByteSet({{'0', '9'}}), static_cast<int32_t>(ra.size()), static_cast<int32_t>(ra.size()));
  if (ra == std::string(ra.size(), '0') && rb == std::string(rb.size(), '9')) return g.Seq({g.ByteSet({{a0, b0}}), any_rest});
  std::vector<ExprId> alts = {g.Seq({g.Bytes(a.substr(0, 1)), SameLengthRange(ra, std::string(ra.size(), '9'))})};
  if (a0 + 1 <= b0 - 1) alts.push_back(g.Seq({g.ByteSet({{static_cast<uint8_t>(a0 + 1), static_cast<uint8_t>(b0 - 1)}}), any_rest}));
  alts.push_back(g.Seq({g.Bytes(b.substr(0, 1)), SameLengthRange(std::string(rb.size(), '0'), rb)}));
  return g.Alt(std::move(alts));
}

// Decimal strings (no leading zeros) of the integers in [lo, hi], 0 <= lo <= hi.
ExprId SchemaConverter::NonNegativeRange(int64_t lo, int64_t hi) {
  const std::string slo = std::to_string(lo), shi = std::to_string(hi);
  std::vector<ExprId> alts;
  int64_t low_of_len = 0;  // smallest number with L digits
  for (size_t len = 1; len <= shi.size(); ++len) {
    const int64_t high_of_len = low_of_len == 0 ? 9 : low_of_len * 10 - 1;
    const int64_t a = std::max(lo, low_of_len), b = std::min(hi, high_of_len);
    if (a <= b) alts.push_back(SameLengthRange(std::to_string(a), std::to_string(b)));
    low_of_len = low_of_len == 0 ? 10 : low_of_len * 10;
  }
  return g_->Alt(std::move(alts));
}

ExprId SchemaConverter::IntegerRange(int64_t lo, int64_t hi) {
  std::vector<ExprId> alts;
  if (lo <= -1) {
    const int64_t mag_lo = hi < 0 ? -hi : 1, mag_hi = -lo;
    alts.push_back(g_->Seq({g_->Bytes("-"), NonNegativeRange(mag_lo, mag_hi)}));
  }
  if (hi >= 0) alts.push_back(NonNegativeRange(std::max<int64_t>(lo, 0), hi));
  return g_->Alt(std::move(alts));
}

// A JSON string key (with quotes) that is none of `names`. Extra keys use raw characters and the
// short escapes only, so a listed name has one spelling to exclude.
ExprId SchemaConverter::KeyExcluding(const std::vector<std::string>& names) {
  Grammar& g = *g_;
  struct Unit {
    uint32_t cp = 0;     // raw character
    std::string esc;     // or an escape
    bool operator<(const Unit& o) const { return std::tie(esc, cp) < std::tie(o.esc, o.cp); }
  };
  const std::vector<std::pair<char, char>> short_escapes = {{'"', '"'}, {'\\', '\\'}, {'\b', 'b'}, {'\f', 'f'},
                                                            {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}};
  // A trie over the names' units.
  struct Node {
    std::map<Unit, int> children;
    bool terminal = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& name : names) {
    int node = 0;
    bool representable = true;
    std::vector<Unit> units;
    for (size_t i = 0; i < name.size() && representable;) {
      uint32_t cp = 0;
      const int n = DecodeUtf8(std::string_view(name).substr(i), &cp);
      if (n == 0) {
        representable = false;
        break;
      }
      i += static_cast<size_t>(n);
      Unit u;
      auto esc = std::find_if(short_escapes.begin(), short_escapes.end(),
                              [&](const auto& p) { return static_cast<uint32_t>(static_cast<uint8_t>(p.first)) == cp; });
      if (esc != short_escapes.end()) u.esc = std::string("\\") + esc->second;
      else if (cp < 0x20) representable = false;
      else u.cp = cp;
      units.push_back(u);
    }
    if (!representable) continue;  // no extra key can spell it anyway
    for (const Unit& u : units) {
      auto it = trie[static_cast<size_t>(node)].children.find(u);
      if (it == trie[static_cast<size_t>(node)].children.end()) {
        trie.push_back(Node{});
        const int child = static_cast<int>(trie.size()) - 1;
        trie[static_cast<size_t>(node)].children.emplace(u, child);
        node = child;
      } else {
        node = it->second;
      }
    }
    trie[static_cast<size_t>(node)].terminal = true;
  }
  std::vector<ExprId> escape_units;
  for (const auto& [c, e] : short_escapes) escape_units.push_back(g.Bytes(std::string("\\") + e));
  const std::vector<CharRange> raw_all = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}};
  const ExprId any_unit = g.Alt({g.CharSet(raw_all), g.Alt(escape_units)});
  const ExprId quote = g.Bytes("\"");
  // Content from trie node `n` to the closing quote.
  std::function<ExprId(int)> from = [&](int n) -> ExprId {
    const Node& node = trie[static_cast<size_t>(n)];
    std::vector<ExprId> alts;
    if (!node.terminal) alts.push_back(quote);
    std::vector<CharRange> raw_taken;
    std::set<std::string> esc_taken;
    for (const auto& [u, child] : node.children) {
      alts.push_back(g.Seq({u.esc.empty() ? g.Char(u.cp) : g.Bytes(u.esc), from(child)}));
      if (u.esc.empty()) raw_taken.push_back({u.cp, u.cp});
      else esc_taken.insert(u.esc);
    }
    // Any other unit leaves every name behind.
    std::vector<CharRange> raw_free = ComplementCharRanges(NormalizeCharRanges(raw_taken));
    std::vector<CharRange> raw_other;
    for (CharRange a : raw_free)
      for (CharRange b : raw_all)
        if (std::max(a.lo, b.lo) <= std::min(a.hi, b.hi)) raw_other.push_back({std::max(a.lo, b.lo), std::min(a.hi, b.hi)});
    std::vector<ExprId> other = {g.CharSet(raw_other)};
    for (const auto& [c, e] : short_escapes)
      if (!esc_taken.count(std::string("\\") + e)) other.push_back(g.Bytes(std::string("\\") + e));
    alts.push_back(g.Seq({g.Alt(other), g.Star(any_unit), quote}));
    return g.Alt(std::move(alts));
  };
  return g.Seq({quote, from(0)});
}

Result<std::optional<int64_t>> SchemaConverter::Count(const Json& s, const char* key, const std::string& path) const {
  auto it = s.find(key);
  if (it == s.end()) return std::optional<int64_t>();
  const Json& v = *it;
  if (v.is_number_unsigned() || v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x >= 0) return std::optional<int64_t>(x);
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= 0 && d == std::floor(d) && d < 1e15) return std::optional<int64_t>(static_cast<int64_t>(d));
  }
  return Error(std::string("'") + key + "' must be a non-negative integer", path + "/" + key);
}

Result<ExprId> SchemaConverter::Ref(const Json& ref, const std::string& path, int depth) {
  if (!ref.is_string()) return Error("'$ref' must be a string", path);
  const std::string r = ref.get<std::string>();
  if (auto it = refs_.find(r); it != refs_.end()) return g_->Ref(it->second);
  if (r.empty() || r[0] != '#') return Error("only local references ('#...') are supported, not '" + r + "'", path);
  const Json* target = &root_;
  if (r.size() > 1) {
    if (r[1] != '/') return Error("'$ref' must be '#' or a JSON pointer '#/...', not '" + r + "'", path);
    try {
      target = &root_.at(Json::json_pointer(r.substr(1)));
    } catch (const nlohmann::json::exception&) {
      return Error("'$ref' target '" + r + "' does not exist", path);
    }
  }
  std::string name = prefix_ + "ref";
  for (char c : r.substr(1)) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  const RuleId rule = g_->NewRule(name);
  refs_.emplace(r, rule);
  PDSERVE_ASSIGN_OR_RETURN(const ExprId body, Convert(*target, r, depth + 1));
  g_->Define(rule, body);
  return g_->Ref(rule);
}

Result<ExprId> SchemaConverter::String(const Json& s, const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(const std::optional<int64_t> min_len, Count(s, "minLength", path));
  PDSERVE_ASSIGN_OR_RETURN(const std::optional<int64_t> max_len, Count(s, "maxLength", path));
  const bool has_pattern = s.contains("pattern"), has_format = s.contains("format");
  if ((has_pattern || has_format) && (min_len || max_len))
    return Error(std::string("'") + (has_pattern ? "pattern" : "format") + "' together with minLength/maxLength is not supported",
                 path);
  if (has_pattern && has_format) return Error("'pattern' together with 'format' is not supported", path);
  ExprId content;
  if (has_pattern) {
    if (!s["pattern"].is_string()) return Error("'pattern' must be a string", path + "/pattern");
    auto r = AddRegex(g_, s["pattern"].get<std::string>(), RegexOptions{.search = true, .json_string = true});
    if (!r.ok()) return Error(r.status().message(), path + "/pattern");
    content = *r;
  } else if (has_format) {
    const Json& f = s["format"];
    if (!f.is_string()) return Error("'format' must be a string", path + "/format");
    auto it = Formats().find(f.get<std::string>());
    if (it == Formats().end()) return Error("unsupported format '" + f.get<std::string>() + "'", path + "/format");
    auto r = AddRegex(g_, it->second, RegexOptions{.search = false, .json_string = true});
    PDSERVE_RETURN_IF_ERROR(r.status());
    content = *r;
  } else {
    const int64_t lo = min_len.value_or(0);
    if (max_len && *max_len > kMaxStringLength)
      return Error("maxLength above " + std::to_string(kMaxStringLength) + " is not supported", path + "/maxLength");
    if (lo > kMaxStringLength)
      return Error("minLength above " + std::to_string(kMaxStringLength) + " is not supported", path + "/minLength");
    if (max_len && *max_len < lo) return Error("maxLength is below minLength: no string satisfies it", path);
    content = g_->Repeat(StringUnit(), static_cast<int32_t>(lo), max_len ? static_cast<int32_t>(*max_len) : kUnbounded);
  }
  return g_->Seq({g_->Bytes("\""), content, g_->Bytes("\"")});
}

Result<ExprId> SchemaConverter::Integer(const Json& s, const std::string& path) {
  int64_t lo = -kMaxIntegerMagnitude, hi = kMaxIntegerMagnitude;
  auto bound = [&](const char* key, bool lower, bool exclusive) -> Status {
    auto it = s.find(key);
    if (it == s.end()) return Status::Ok();
    if (it->is_boolean())
      return Error(std::string("boolean '") + key + "' (draft 4) is not supported; use a number", path + "/" + key);
    if (!it->is_number()) return Error(std::string("'") + key + "' must be a number", path + "/" + key);
    const double v = it->get<double>();
    double b = lower ? (exclusive ? std::floor(v) + 1 : std::ceil(v)) : (exclusive ? std::ceil(v) - 1 : std::floor(v));
    b = std::clamp(b, static_cast<double>(-kMaxIntegerMagnitude), static_cast<double>(kMaxIntegerMagnitude));
    if (lower) lo = std::max(lo, static_cast<int64_t>(b));
    else hi = std::min(hi, static_cast<int64_t>(b));
    return Status::Ok();
  };
  PDSERVE_RETURN_IF_ERROR(bound("minimum", true, false));
  PDSERVE_RETURN_IF_ERROR(bound("exclusiveMinimum", true, true));
  PDSERVE_RETURN_IF_ERROR(bound("maximum", false, false));
  PDSERVE_RETURN_IF_ERROR(bound("exclusiveMaximum", false, true));
  if (lo > hi) return Error("no integer satisfies the bounds", path);
  return IntegerRange(lo, hi);
}

Result<ExprId> SchemaConverter::Object(const Json& s, const std::string& path, int depth) {
  Grammar& g = *g_;
  struct Prop {
    std::string name;
    ExprId value;
    bool required;
  };
  std::vector<Prop> props;
  std::set<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) return Error("'required' must be a list of strings", path + "/required");
    for (size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_string()) return Error("'required' must be a list of strings", path + "/required/" + std::to_string(i));
      required.insert((*it)[i].get<std::string>());
    }
  }
  if (auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) return Error("'properties' must be an object", path + "/properties");
    for (const auto& [name, sub] : it->items()) {
      PDSERVE_ASSIGN_OR_RETURN(const ExprId value, Convert(sub, path + "/properties/" + PointerToken(name), depth + 1));
      props.push_back({name, value, required.count(name) > 0});
    }
  }
  // Extra keys: none, any value, or values of a schema.
  ExprId extra_value = -1;
  if (auto it = s.find("additionalProperties"); it != s.end()) {
    if (it->is_boolean()) {
      if (it->get<bool>()) extra_value = AnyValue();
    } else if (it->is_object()) {
      PDSERVE_ASSIGN_OR_RETURN(extra_value, Convert(*it, path + "/additionalProperties", depth + 1));
    } else {
      return Error("'additionalProperties' must be a boolean or a schema", path + "/additionalProperties");
    }
  } else if (!o_.strict) {
    extra_value = AnyValue();
  }
  for (const std::string& name : required) {
    if (std::any_of(props.begin(), props.end(), [&](const Prop& p) { return p.name == name; })) continue;
    if (extra_value < 0)
      return Error("required property '" + name + "' is not in 'properties' and additionalProperties is false",
                   path + "/required");
    props.push_back({name, extra_value, true});
  }
  auto member = [&](ExprId key, ExprId value) { return g.Seq({key, Ws(), g.Bytes(":"), Ws(), value}); };
  std::vector<std::string> names;
  for (const Prop& p : props) names.push_back(p.name);
  ExprId some = g.Empty(), none = g.Empty();  // the rest, after / before a first member
  if (extra_value >= 0) {
    const ExprId extra = member(KeyExcluding(names), extra_value);
    some = g.Star(g.Seq({Sep(), extra}));
    none = g.Optional(g.Seq({extra, some}));
  }
  for (size_t i = props.size(); i-- > 0;) {
    const ExprId m = member(g.Bytes(Json(props[i].name).dump()), props[i].value);
    if (props[i].required) {
      none = g.Seq({m, some});
      some = g.Seq({Sep(), m, some});
    } else {
      none = g.Alt({g.Seq({m, some}), none});
      some = g.Seq({g.Optional(g.Seq({Sep(), m})), some});
    }
  }
  return g.Seq({g.Bytes("{"), Ws(), none, Ws(), g.Bytes("}")});
}

Result<ExprId> SchemaConverter::Array(const Json& s, const std::string& path, int depth) {
  Grammar& g = *g_;
  std::vector<ExprId> prefix;
  if (auto it = s.find("prefixItems"); it != s.end()) {
    if (!it->is_array()) return Error("'prefixItems' must be a list of schemas", path + "/prefixItems");
    for (size_t i = 0; i < it->size(); ++i) {
      PDSERVE_ASSIGN_OR_RETURN(const ExprId e, Convert((*it)[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
      prefix.push_back(e);
    }
  }
  ExprId items = -1;
  if (auto it = s.find("items"); it != s.end()) {
    if (it->is_boolean()) {
      if (it->get<bool>()) items = AnyValue();
    } else if (it->is_object()) {
      PDSERVE_ASSIGN_OR_RETURN(items, Convert(*it, path + "/items", depth + 1));
    } else {
      return Error("'items' must be a schema (tuples use 'prefixItems')", path + "/items");
    }
  } else {
    items = AnyValue();
  }
  if (auto it = s.find("uniqueItems"); it != s.end()) {
    if (!it->is_boolean()) return Error("'uniqueItems' must be a boolean", path + "/uniqueItems");
    if (it->get<bool>()) return Error("unsupported keyword 'uniqueItems': true", path);
  }
  PDSERVE_ASSIGN_OR_RETURN(const std::optional<int64_t> min_items, Count(s, "minItems", path));
  PDSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> max_items, Count(s, "maxItems", path));
  const int64_t lo = min_items.value_or(0);
  int64_t hi = max_items ? *max_items : -1;  // -1: unbounded
  if (items < 0) hi = hi < 0 ? static_cast<int64_t>(prefix.size()) : std::min<int64_t>(hi, static_cast<int64_t>(prefix.size()));
  if (hi >= 0 && lo > hi) return Error("no array satisfies minItems/maxItems (and items)", path);
  if (lo > 10000 || hi > 10000) return Error("minItems/maxItems above 10000 are not supported", path);
  // Elements from slot k on (k > 0: each after a separator).
  std::function<ExprId(int64_t)> tail = [&](int64_t k) -> ExprId {
    if (hi >= 0 && k >= hi) return g.Empty();
    if (k >= static_cast<int64_t>(prefix.size())) {
      const int32_t rest_lo = static_cast<int32_t>(std::max<int64_t>(0, lo - k));
      const int32_t rest_hi = hi < 0 ? kUnbounded : static_cast<int32_t>(hi - k);
      if (k == 0) {
        const ExprId body = g.Seq({items, g.Repeat(g.Seq({Sep(), items}), std::max(0, rest_lo - 1),
                                                   rest_hi == kUnbounded ? kUnbounded : rest_hi - 1)});
        return rest_lo >= 1 ? body : g.Optional(body);
      }
      return g.Repeat(g.Seq({Sep(), items}), rest_lo, rest_hi);
    }
    const ExprId element = k == 0 ? prefix[0] : g.Seq({Sep(), prefix[static_cast<size_t>(k)]});
    const ExprId body = g.Seq({element, tail(k + 1)});
    return k < lo ? body : g.Optional(body);
  };
  return g.Seq({g.Bytes("["), Ws(), tail(0), Ws(), g.Bytes("]")});
}

Result<ExprId> SchemaConverter::Convert(const Json& s, const std::string& path, int depth) {
  Grammar& g = *g_;
  if (depth > kMaxSchemaDepth) return Error("schema nests deeper than " + std::to_string(kMaxSchemaDepth) + " levels", path);
  if (s.is_boolean()) {
    if (s.get<bool>()) return AnyValue();
    return Error("schema 'false' allows no value", path);
  }
  if (!s.is_object()) return Error("a schema must be an object or a boolean", path);
  std::vector<std::string> constraining;  // keywords besides annotations and definitions
  for (const auto& [k, v] : s.items()) {
    if (IsAnnotation(k)) continue;
    if (!Supported().count(k)) return Error("unsupported keyword '" + k + "'", path);
    if (k != "$defs" && k != "definitions") constraining.push_back(k);
    if ((k == "$defs" || k == "definitions") && !v.is_object())
      return Error("'" + k + "' must be an object", path + "/" + k);
  }
  for (const char* combinator : {"$ref", "anyOf", "allOf"}) {
    if (!s.contains(combinator)) continue;
    for (const std::string& k : constraining)
      if (k != combinator)
        return Error("keyword '" + k + "' next to '" + combinator + "' is not supported", path);
  }
  if (auto it = s.find("$ref"); it != s.end()) return Ref(*it, path + "/$ref", depth);
  if (auto it = s.find("anyOf"); it != s.end()) {
    if (!it->is_array() || it->empty()) return Error("'anyOf' must be a non-empty list", path + "/anyOf");
    std::vector<ExprId> alts;
    for (size_t i = 0; i < it->size(); ++i) {
      PDSERVE_ASSIGN_OR_RETURN(const ExprId e, Convert((*it)[i], path + "/anyOf/" + std::to_string(i), depth + 1));
      alts.push_back(e);
    }
    return g.Alt(std::move(alts));
  }
  if (auto it = s.find("allOf"); it != s.end()) {
    if (!it->is_array() || it->size() != 1)
      return Error("'allOf' is supported with exactly one subschema", path + "/allOf");
    return Convert((*it)[0], path + "/allOf/0", depth + 1);
  }
  bool nullable = false;
  if (auto it = s.find("nullable"); it != s.end()) {
    if (!it->is_boolean()) return Error("'nullable' must be a boolean", path + "/nullable");
    nullable = it->get<bool>();
  }
  if (auto it = s.find("const"); it != s.end()) {
    const ExprId lit = Literal(*it);
    return nullable ? g.Alt({lit, g.Bytes("null")}) : lit;
  }
  // Types: given, or inferred from type-specific keywords, or any.
  std::vector<std::string> types;
  if (auto it = s.find("type"); it != s.end()) {
    static const std::set<std::string> kTypes = {"string", "number", "integer", "boolean", "null", "object", "array"};
    const Json list = it->is_array() ? *it : Json::array({*it});
    if (list.empty()) return Error("'type' must not be an empty list", path + "/type");
    for (const Json& t : list) {
      if (!t.is_string() || !kTypes.count(t.get<std::string>()))
        return Error("'type' must name JSON types (string, number, integer, boolean, null, object, array)",
                     path + "/type");
      if (std::find(types.begin(), types.end(), t.get<std::string>()) == types.end()) types.push_back(t.get<std::string>());
    }
  } else {
    for (const auto& [k, v] : s.items()) {
      auto kt = KeywordType().find(k);
      if (kt != KeywordType().end() && std::find(types.begin(), types.end(), kt->second) == types.end())
        types.push_back(kt->second);
    }
  }
  if (nullable && !types.empty() && std::find(types.begin(), types.end(), "null") == types.end()) types.push_back("null");
  if (auto it = s.find("enum"); it != s.end()) {
    if (!it->is_array() || it->empty()) return Error("'enum' must be a non-empty list", path + "/enum");
    auto matches = [&](const Json& v) {
      if (types.empty()) return true;
      for (const std::string& t : types) {
        if ((t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
            (t == "integer" && (v.is_number_integer() || v.is_number_unsigned())) ||
            (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
            (t == "array" && v.is_array()))
          return true;
      }
      return false;
    };
    std::vector<ExprId> alts;
    std::set<std::string> seen;
    for (const Json& v : *it)
      if ((matches(v) || (nullable && v.is_null())) && seen.insert(v.dump()).second) alts.push_back(Literal(v));
    if (nullable && !seen.count("null")) alts.push_back(g.Bytes("null"));
    if (alts.empty()) return Error("no 'enum' value has the schema's type", path + "/enum");
    return g.Alt(std::move(alts));
  }
  if (types.empty()) return AnyValue();
  std::vector<ExprId> alts;
  for (const std::string& t : types) {
    if (t == "string") {
      PDSERVE_ASSIGN_OR_RETURN(const ExprId e, String(s, path));
      alts.push_back(e);
    } else if (t == "number") {
      for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
        if (s.contains(k))
          return Error(std::string("unsupported keyword '") + k + "' on type number (bounds are supported on integers)", path);
      alts.push_back(Number());
    } else if (t == "integer") {
      PDSERVE_ASSIGN_OR_RETURN(const ExprId e, Integer(s, path));
      alts.push_back(e);
    } else if (t == "boolean") {
      alts.push_back(g.Alt({g.Bytes("true"), g.Bytes("false")}));
    } else if (t == "null") {
      alts.push_back(g.Bytes("null"));
    } else if (t == "object") {
      PDSERVE_ASSIGN_OR_RETURN(const ExprId e, Object(s, path, depth));
      alts.push_back(e);
    } else {
      PDSERVE_ASSIGN_OR_RETURN(const ExprId e, Array(s, path, depth));
      alts.push_back(e);
    }
  }
  return g.Alt(std::move(alts));
}

ExprId SchemaConverter::AnyValue() {
  if (any_value_ >= 0) return g_->Ref(any_value_);
  Grammar& g = *g_;
  any_value_ = g.NewRule(prefix_ + "json_value");
  const RuleId object = g.NewRule(prefix_ + "json_object"), array = g.NewRule(prefix_ + "json_array");
  const ExprId value = g.Ref(any_value_);
  const ExprId member = g.Seq({AnyString(), Ws(), g.Bytes(":"), Ws(), value});
  g.Define(object, g.Seq({g.Bytes("{"), Ws(), g.Optional(g.Seq({member, g.Star(g.Seq({Sep(), member}))})), Ws(),
                          g.Bytes("}")}));
  g.Define(array, g.Seq({g.Bytes("["), Ws(), g.Optional(g.Seq({value, g.Star(g.Seq({Sep(), value}))})), Ws(),
                         g.Bytes("]")}));
  g.Define(any_value_, g.Alt({g.Ref(object), g.Ref(array), AnyString(), Number(), g.Bytes("true"), g.Bytes("false"),
                              g.Bytes("null")}));
  any_object_ = object;
  return value;
}

ExprId SchemaConverter::AnyObject() {
  AnyValue();
  return g_->Ref(any_object_);
}

Result<Json> ParseSchema(std::string_view text, const std::string& where) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument((where.empty() ? "" : where + ": ") + "json_schema: not valid JSON: " + e.what());
  }
}

}  // namespace

Result<ExprId> AddJsonSchema(Grammar* g, std::string_view schema_json, const JsonSchemaOptions& options,
                             std::string_view where, std::string_view rule_prefix) {
  PDSERVE_ASSIGN_OR_RETURN(const Json schema, ParseSchema(schema_json, std::string(where)));
  SchemaConverter c(g, schema, options, std::string(where), std::string(rule_prefix));
  try {
    return c.Convert(schema, "#", 0);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument((where.empty() ? "" : std::string(where) + ": ") + "json_schema: " + e.what());
  }
}

Status ValidateJsonSchema(std::string_view schema_json, std::string_view where, const JsonSchemaOptions& options) {
  Grammar g;
  return AddJsonSchema(&g, schema_json, options, where).status();
}

Result<Grammar> GrammarFromJsonSchema(std::string_view schema_json, const JsonSchemaOptions& options) {
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  g.SetRoot(root);
  PDSERVE_ASSIGN_OR_RETURN(const ExprId value, AddJsonSchema(&g, schema_json, options));
  g.Define(root, g.Seq({Whitespace(&g, options), value, Whitespace(&g, options)}));
  return g;
}

Grammar GrammarForJsonObject(const JsonSchemaOptions& options) {
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  g.SetRoot(root);
  const Json none;
  SchemaConverter c(&g, none, options, "", "");
  g.Define(root, g.Seq({Whitespace(&g, options), c.AnyObject(), Whitespace(&g, options)}));
  return g;
}

}  // namespace pdserve::grammar
